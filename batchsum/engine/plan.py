"""The dry-run plan (``plan_batch``, ``BatchPlan``): every row classified as the engine would (sent,
duplicate, known, skipped, a long text's parts, and its reduce replayed from the answers kept when
its parts are answered), and nothing sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..data.results import OK, Answer
from ..data.stores import AnswerStore
from ..service import contract
from ..service.client import validate_params
from . import long_texts
from .fingerprints import text_fingerprint
from .options import SKIP, TRUNCATE

__all__ = ["BatchPlan", "plan_batch"]


@dataclass
class BatchPlan:
    """What a run would do, without sending anything (``--dry-run``)."""

    rows: int = 0
    to_send: int = 0  # distinct requests the store does not answer (rows, long texts' parts, reduces replayed)
    duplicates: int = 0  # rows that share a request with an earlier row
    known: int = 0  # rows the journal or the answer store already answers
    known_store: int = 0  # of those, rows the answer store shared beyond the output answers
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    long_rows: int = 0  # rows over the limit that long_texts="split" or "truncate" sends
    parts: int = 0  # part requests to send: exact
    reduces: int = 0  # reduce requests to send, exact (a row whose parts are answered: its reduce replayed)
    reduce_max: int = 0  # reduce requests beyond those: at most this many (fewer when the summaries are short)
    skipped_long_cost: tuple[int, int] = (0, 0)  # what splitting the skipped long rows would take

    def minimum_seconds(self, rpm: float, first: int = 1) -> float:
        """The least time the requests can take at ``rpm`` (starts evenly spaced; the ``first`` at
        once: each key's lone first request, every key's together)."""
        return max(0, self.to_send - first) * 60.0 / rpm if rpm else 0.0

    def describe(
        self,
        rpm: float | None,
        first: int = 1,
        *,
        seconds: float | None = None,
        waited: float = 0.0,
        stops_after: int | None = None,
    ) -> str:
        """The plan in lines; ``rpm`` None: the limit is not known yet (``rpm="auto"``); ``first``:
        requests that go at once (one per key). From the keys' quotas (``pacing.look.forecast.project``):
        ``seconds`` the time the requests take, ``waited`` of it waiting for a quota's reset, and
        ``stops_after``: the requests sent before a quota stops the run (None: it does not)."""
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped_by_reason.items())) or "none"
        waits = f", {_duration(waited)} of it waiting for a quota to reset" if waited else ""
        if stops_after is not None:
            about = f"about {stops_after}" if stops_after else "none"
            at = f"at {rpm:g} requests/min, " if rpm else ""
            pace = f"{at}{about} of them before a quota stops the run (see quota below)"
        elif rpm is None:
            pace = "how long that takes depends on the limit, not known yet" + (
                f" (a wait for a quota to reset, {_duration(waited)}, included)" if waited else ""
            )
        elif rpm:
            took = seconds if seconds is not None else self.minimum_seconds(rpm, first)
            pace = f"at {rpm:g} requests/min that takes at least {_duration(took)}{waits}"
        else:
            pace = "unpaced (rpm 0)" + (f", {_duration(waited)} waiting for a quota to reset" if waited else "")
        sends = f"{_count(self.to_send, 'request')}"
        if self.reduce_max:  # a long text's reduce requests depend on how long its parts' summaries are
            sends = f"{self.to_send} to {_count(self.to_send + self.reduce_max, 'request')}"
        lines = [
            f"rows:             {self.rows}",
            f"would send:       {sends}; {pace}",
            f"already answered: {_count(self.known, 'row')} ({self._where_known()})",
            f"duplicates:       {_count(self.duplicates, 'row')} share a request with an earlier row",
            f"would skip:       {_count(sum(self.skipped_by_reason.values()), 'row')} ({skipped})",
        ]
        if self.long_rows:
            if not self.reduce_max:
                reduces = _count(self.reduces, "reduce request")
            elif self.reduces:
                reduces = f"{self.reduces} to {self.reduces + self.reduce_max} reduce requests"
            else:
                reduces = f"at most {self.reduce_max} reduce requests"
            lines.append(
                f"long texts:       {_count(self.long_rows, 'row')} over the limit: {self.parts} part requests "
                f"and {reduces} (in the requests above)"
            )
        if self.skipped_long_cost[0]:
            parts, reduce = self.skipped_long_cost
            lines.append(
                f"long texts:       the {self.skipped_by_reason['too_long']} too_long rows would take {parts} "
                f"part requests and at most {reduce} reduce requests with --long-texts split"
            )
        return "\n".join(lines)

    def _where_known(self) -> str:
        if not self.known_store:
            return "journal"
        journal = self.known - self.known_store
        return f"{self.known_store} in the store" + (f", {journal} in the journal" if journal else "")


def _count(n: int, noun: str) -> str:
    """``1 row``, ``3 rows``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def plan_batch(
    texts: Iterable[Any],
    *,
    mode: Any = contract.Mode.STANDARD,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    params: contract.Params | None = None,
    store: AnswerStore | None = None,
    long_texts_policy: str = SKIP,
    shared: AnswerStore | None = None,
) -> BatchPlan:
    """Classify every row as the engine would, and send nothing. ``store``: the output's journal;
    ``shared``: the answer store shared beyond it (the machine's, the cluster's)."""
    params = params if params is not None else validate_params(mode, percentage, type)
    plan = BatchPlan()
    seen: set[bytes] = set()

    def known(key: str) -> str | None:
        """Where the answer is kept: the journal, else the store; None when nowhere."""
        if store is not None and store.get(key) is not None:
            return "journal"
        if shared is not None and shared.get(key) is not None:
            return "store"
        return None

    def answer(text: str, request_params: contract.Params) -> Answer | None:
        """The answer kept for a request (the journal's, else the store's); None: none kept."""
        key = text_fingerprint(request_params)(text)
        found = store.get(key) if store is not None else None
        return found if found is not None or shared is None else shared.get(key)

    def kept(text: str, request_params: contract.Params) -> tuple[bool, str] | None:
        found = answer(text, request_params)
        return None if found is None else (found.status == OK, found.summary or "")

    def count(text: str, request_params: contract.Params) -> bool:
        """True when this request is new: neither an earlier row's nor kept."""
        key = text_fingerprint(request_params)(text)
        digest = bytes.fromhex(key)
        if digest in seen:
            return False
        seen.add(digest)
        if known(key):
            return False
        plan.to_send += 1
        return True

    for text in texts:
        plan.rows += 1
        problem = contract.text_problem(text)
        if problem is not None and problem[0] is contract.SkipReason.TOO_LONG and long_texts_policy != SKIP:
            plan.long_rows += 1
            if long_texts_policy == TRUNCATE:
                count(long_texts.truncate_text(text), params)
                continue
            pieces, words = long_texts.split_text(text), contract.count_words(text)
            part_params = long_texts.part_params(params)
            plan.parts += sum(count(piece, part_params) for piece in pieces)
            answers = [answer(piece, part_params) for piece in pieces]
            if any(found is None for found in answers):  # parts still to send: their summaries are not known
                plan.reduce_max += long_texts.estimate_requests(words)[1]
            elif all(found.status == OK for found in answers if found is not None):  # else the row fails: no reduce
                summaries = [found.summary or "" for found in answers if found is not None]
                replay = long_texts.replay_reduce(summaries, words, params, kept)
                plan.reduces += sum(count(reduced, reduce_params) for reduced, reduce_params in replay.to_send)
                plan.reduce_max += replay.more
            continue
        if problem is not None:
            plan.skipped_by_reason[problem[0].value] += 1
            if problem[0] is contract.SkipReason.TOO_LONG:
                parts, reduce = long_texts.estimate_requests(contract.count_words(text))
                plan.skipped_long_cost = (plan.skipped_long_cost[0] + parts, plan.skipped_long_cost[1] + reduce)
            continue
        key = text_fingerprint(params)(text)
        if bytes.fromhex(key) in seen:
            plan.duplicates += 1
        elif (where := known(key)) is not None:
            seen.add(bytes.fromhex(key))
            plan.known += 1
            plan.known_store += where == "store"
        else:
            count(text, params)
    return plan
