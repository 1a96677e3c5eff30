"""Rows in (``Intake``): each row read gets its result, or the task that gives it: skipped, outside the
sample, known, under way, sent, or a long text's; rows read together are resolved in bulk."""

from __future__ import annotations

import asyncio
from itertools import compress, count, repeat
from operator import is_
from typing import Any, cast

from ..data.results import FAILED, SKIPPED, RowResult
from ..service import contract
from ._known import KnownTexts
from ._long_rows import LongRows
from ._requests import Requests
from ._stop import NOT_SENT, Stop
from ._window import Known, Pending
from .fingerprints import text_fingerprint
from .options import SKIP, SPLIT, RunOptions
from .tally import BatchStats

__all__ = ["Intake"]


class Intake:
    """The rows of one run as they are read, in order: what each needs (nothing: skipped or known; a
    request: joined, known or new; a long text's requests), the work done once per distinct text
    (``KnownTexts``); after a stop that gives every row its record, ``not_sent`` for a new request."""

    __slots__ = ("params", "options", "stats", "requests", "halt", "long_rows", "known", "read")

    def __init__(
        self, params: contract.Params, options: RunOptions, stats: BatchStats, requests: Requests, halt: Stop
    ) -> None:
        self.params = params
        self.options = options
        self.stats = stats
        self.requests = requests
        self.halt = halt
        self.long_rows = LongRows(requests.answer, params, stats)
        self.known = KnownTexts()
        self.read = 0  # rows submitted (the next row's position, for the sample)

    def submit(self, text: Any) -> Pending:
        """A row's result, or the task that will give it: skipped with a reason, not in the sample,
        known, under way, or sent (a long text as ``long_texts`` says); after a stop that gives every
        row its record, a row that would need a new request is ``not_sent``."""
        position, self.read = self.read, self.read + 1
        problem = contract.text_problem(text)
        long = problem is not None and problem[0] is contract.SkipReason.TOO_LONG and self.options.long_texts != SKIP
        if problem is not None and not long:
            return self.skipped(text, problem)
        sample = self.options.sample_rows
        if sample is not None and position not in sample:
            message = f"not sent: not in the sample of {len(sample)} rows; a run without sample sends it"
            return RowResult(None, FAILED, NOT_SENT, message, None, 0, 0)
        return self.send_row(text, long)

    def skipped(self, text: Any, problem: tuple[contract.SkipReason, str]) -> RowResult:
        reason, message = problem
        if reason is contract.SkipReason.TOO_LONG:
            self.stats.long_skipped(contract.count_words(text))
        return RowResult(None, SKIPPED, reason.value, message, None, 0, 0)

    def send_row(self, text: Any, long: bool, looked: bool = False) -> Pending:
        """The row's answer: known, under way, or a new request (a long text's as ``long_texts``
        says); ``not_sent`` when a stop forbids new ones. ``looked``: the block's look-up asked the
        store for it already."""
        if long:
            if self.halt.stopped.is_set():
                return self.halt.not_sent()
            rows = self.long_rows
            return asyncio.ensure_future(rows.split(text) if self.options.long_texts == SPLIT else rows.truncated(text))
        item = self.requests.request(text, self.params, new=not self.halt.stopped.is_set(), looked=looked)
        return item if item is not None else self.halt.not_sent()

    async def submit_block(self, texts: list[Any]) -> list[Pending | Known]:
        """``submit`` for rows read together, in order, with the work done once per distinct text: the
        rows that need no request (skipped, or answered by the store: looked up in bulk, one query
        for the block, off the event loop) come back in runs (``Known``), the others one by one as
        ``submit`` gives them."""
        if self.options.sample_rows is not None:  # the sample goes by position: row by row
            return [self.submit(text) for text in texts]
        self.read += len(texts)
        known = self.known
        try:
            rows: list[RowResult | None] = list(map(known.rows.get, texts))  # at C speed: a rerun's rows
            if known.stored:  # rows a text seen before answers, which came from the store (a known text's)
                self.stats.from_store += sum(map(known.stored.__contains__, texts))
        except TypeError:  # a cell that cannot be a key (a list)
            rows = [None] * len(texts)
        skips = known.skips
        resolved: list[RowResult]
        if None in rows:
            skips += await self._resolve(texts, rows)
            resolved = [row for row in rows if row is not None]
        else:
            resolved = cast("list[RowResult]", rows)  # every row known: the list itself
        reused = sum(1 for row in resolved if row.status != SKIPPED) if skips else len(resolved)
        self.stats.reused += reused
        if len(resolved) == len(rows):
            return [resolved]
        items: list[Pending | Known] = []
        run: Known = []
        for text, row in zip(texts, rows):
            if row is not None:
                run.append(row)
                continue
            if run:
                items.append(run)
                run = []
            problem = contract.text_problem(text)
            items.append(self.send_row(text, problem is not None, looked=True))  # a new request, or a long text's
        if run:
            items.append(run)
        return items

    async def _resolve(self, texts: list[Any], rows: list[RowResult | None]) -> int:
        """Fill in ``rows`` (None: not known yet) what needs no request: skipped texts, and answers
        the store has (one look-up for the block). Rows still None need a request (or are long
        texts that ``long_texts`` sends). Returns how many skipped rows there may be."""
        missing: dict[str, list[int]] = {}  # fingerprint -> positions
        identify = text_fingerprint(self.params)
        skips = 0
        for i in compress(count(), map(is_, rows, repeat(None))):  # the unknown rows alone, found at C speed
            text = texts[i]
            problem = contract.text_problem(text)
            if problem is not None:
                if problem[0] is contract.SkipReason.TOO_LONG and self.options.long_texts != SKIP:
                    continue
                rows[i] = self.skipped(text, problem)  # a too_long skip is counted for each row: its words
                if type(text) is str and problem[0] is not contract.SkipReason.TOO_LONG:
                    self.known.put(text, rows[i])  # type: ignore[arg-type]
                skips += 1
                continue
            missing.setdefault(identify(text), []).append(i)
        wanted = [key for key in missing if key not in self.requests.under_way]
        found, stored = await self.requests.answers.lookup(wanted) if wanted else ({}, set())
        for key, answer in found.items():
            result = answer.row()
            self.known.put(texts[missing[key][0]], result, stored=key in stored)
            for i in missing[key]:
                rows[i] = result
            if key in stored:
                self.stats.from_store += len(missing[key])
        return skips
