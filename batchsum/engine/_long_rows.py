"""Rows over the word limit (``LongRows``), as ``long_texts`` says: truncated, or split into parts
whose summaries are reduced into one answer, every request an ordinary one of the batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..data.results import OK, Answer, RowResult
from ..service import contract
from . import long_texts
from ._requests import PART, REDUCE, ROW
from .tally import BatchStats

__all__ = ["LongRows"]


def _first_failure(answers: list[Answer], what: str, count: int) -> RowResult | None:
    """The row's result when one of its requests failed: that error, saying which request."""
    for number, answer in enumerate(answers, 1):
        if answer.status != OK:
            return answer.row(0, f"{what} {number} of {count}: {answer.message}")
    return None


class LongRows:
    """Rows over the word limit, as ``long_texts`` says: truncated, or split into parts whose
    summaries are reduced into one answer. Every request is an ordinary one of the batch."""

    __slots__ = ("answer", "params", "stats")

    def __init__(
        self,
        answer: Callable[[str, contract.Params, str], Awaitable[Answer]],
        params: contract.Params,
        stats: BatchStats,
    ) -> None:
        self.answer = answer  # one request's answer, by text, parameters and kind (``Requests.answer``)
        self.params = params
        self.stats = stats

    async def truncated(self, text: str) -> RowResult:
        """``long_texts="truncate"``: the first words up to the limit, and the row says so."""
        kept = long_texts.truncate_text(text)
        answer = await self.answer(kept, self.params, ROW)
        note = (
            f"truncated: the summary is of the first {contract.count_words(kept)} of "
            f"{contract.count_words(text)} words (long_texts='truncate')"
        )
        return answer.row(1, note if answer.status == OK else None)

    async def split(self, text: str) -> RowResult:
        """``long_texts="split"``: the parts summarized, then their summaries summarized (a tree when
        they are too long for one request) into one answer of the row's type and length. Every
        request goes the way of any other (store, dedup, claims, budget, pacer, retries)."""
        parts = long_texts.split_text(text)
        self.stats.long_planned(len(parts))
        answers = await asyncio.gather(
            *(self.answer(part, long_texts.part_params(self.params), PART) for part in parts)
        )
        failed = _first_failure(answers, "part", len(parts))
        if failed is not None:
            return self.stats.long_done(failed, len(parts), answers)
        plan = long_texts.reduce_plan([a.summary or "" for a in answers], contract.count_words(text), self.params)
        done: list[Answer] = list(answers)
        try:
            step = next(plan)
            while True:
                round_answers = await asyncio.gather(*(self.answer(t, step.params, REDUCE) for t in step.texts))
                done.extend(round_answers)
                failed = _first_failure(round_answers, "reduce step", len(step.texts))
                if failed is not None:
                    return self.stats.long_done(failed, len(parts), done)
                step = plan.send([a.summary or "" for a in round_answers])
        except StopIteration as end:
            reduced: long_texts.Reduced = end.value
        note = f"summarized in {len(parts)} parts and {reduced.requests} reduce requests"
        if reduced.note:
            note = f"{note}; {reduced.note}"
        attempts = sum(a.attempts for a in done)
        result = RowResult(reduced.text, OK, None, note, 200, attempts, len(done))
        return self.stats.long_done(result, len(parts), done)
