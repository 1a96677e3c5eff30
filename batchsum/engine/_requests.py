"""A batch's requests (``Requests``): known (the store), under way (joined), or sent on a key through
the gate (the key chosen by ``_keys.Keys``, its first request alone), claimed at its turn when several
runs share the store; and which of them a stop cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..data.results import FAILED, OK, Answer
from ..pacing.pacer import AtTurn, TurnGiven
from ..service import contract
from ..service.client import PreparedRequest
from ..service.errors import (
    APIError,
    APIResponseValidationError,
    APIStatusError,
    AuthenticationError,
    BatchsumError,
    BudgetError,
    NotPremiumError,
    RunCancelled,
    UnprocessableEntityError,
)
from ._answers import Answers, Claim
from ._gate import Gate, LaneHooks
from ._keys import KeyOut, Keys, LaneState
from .fingerprints import text_fingerprint
from .tally import BatchStats

__all__ = ["Requests", "ROW", "PART", "REDUCE"]

ROW, PART, REDUCE = "row", "part", "reduce"  # what a request is for (the account counts them apart)


def _failure(error: APIError) -> Answer:
    status = error.status_code if isinstance(error, APIStatusError) else None
    return Answer(None, FAILED, error.code, error.message, status, error.attempts)


def _is_permanent(error: APIError) -> bool:
    """A refusal that asking again would repeat (and pay for again): kept across runs."""
    if isinstance(error, APIResponseValidationError):
        return not error.transient
    return isinstance(error, UnprocessableEntityError)


class Requests:
    """The requests of one run: each answered once, known (the store, this run), joined while under
    way, or sent on the key ``keys`` chooses; a key refused (401) leaves the run and its requests go to
    the others; the refusal of the last key, and a budget gone, stop the batch (``stop``). A stop
    cancels what is not on the wire yet. With a store several runs share, a request is claimed at its
    turn (``Claim``): a text another run has on the wire gives the turn to the next and waits for that
    run's answer (``Answers.waiting``), awaited when it reaches the head of the output."""

    __slots__ = ("keys", "stats", "answers", "gate", "stopped", "stop", "under_way")

    def __init__(
        self,
        keys: Keys,
        stats: BatchStats,
        answers: Answers,
        gate: Gate,
        stopped: asyncio.Event,
        stop: Callable[[BatchsumError], None],
    ) -> None:
        self.keys = keys
        self.stats = stats
        self.answers = answers
        self.gate = gate
        self.stopped = stopped
        self.stop = stop
        self.under_way: dict[str, asyncio.Task[Answer]] = {}

    def request(
        self, text: str, params: contract.Params, kind: str = ROW, *, new: bool = True, looked: bool = False
    ) -> Answer | asyncio.Task[Answer] | None:
        """The answer to one request: known (its own scope, this run), under way (an identical request
        of this run, joined), or a new task that asks the store (unless ``looked``: a block's look-up
        did), then claims and sends it (None when ``new`` is False). ``kind`` counts it: a row's
        request, a long text's part, or a reduce."""
        request = PreparedRequest(text, params)
        key = text_fingerprint(params)(text)
        task = self.under_way.get(key)
        if task is not None:
            self.stats.reused += 1
            return task
        if not looked and (known := self.answers.known(key)) is not None:
            self.stats.reused += 1
            return known
        if not new:
            return None
        task = asyncio.ensure_future(self.fetch(key, request, kind, looked=looked))
        self.under_way[key] = task
        task.add_done_callback(lambda _: self.under_way.pop(key, None))
        return task

    async def answer(self, text: str, params: contract.Params, kind: str) -> Answer:
        item = self.request(text, params, kind)
        assert item is not None  # a new request is allowed here
        return await item if isinstance(item, asyncio.Task) else item

    def _reused(self, answer: Answer, stored: bool) -> Answer:
        self.stats.reused += 1
        self.stats.from_store += stored
        return answer

    async def fetch(self, key: str, request: PreparedRequest, kind: str = ROW, *, looked: bool = True) -> Answer:
        """The store's answer (asked now unless ``looked``), another run's (at its turn, or set aside), or sent."""
        answers = self.answers
        if not looked and (stored := await answers.stored(key)) is not None:
            return self._reused(stored, True)
        if not answers.shared:
            return await self.send(key, request, kind)
        claim = Claim(answers, key)
        try:
            while True:
                try:
                    return await self.send(key, request, kind, claim.at_turn)
                except TurnGiven:
                    pass
                if claim.answer is not None:  # another run answered it since it was looked up
                    return self._reused(claim.answer, answers.from_store)
                theirs = await answers.waiting.answer(key)  # on another run's wire: set aside
                if theirs is not None:
                    return self._reused(theirs, answers.from_store)
                # that run let it go unanswered (or died): this run takes a turn for it
        finally:
            claim.release()

    async def send(self, key: str, request: PreparedRequest, kind: str = ROW, at_turn: AtTurn | None = None) -> Answer:
        """Send ``request`` on the key ``keys`` gives it; again on another when that key leaves the run
        (or on the same key once it is back), with the patience it had: ``max_wait`` counts from its
        first 429 on any key, so 429s that take a key out for a while still end it. ``at_turn``: asked
        at each attempt's turn whether it still goes (``TurnGiven`` when it does not)."""
        first_429: float | None = None
        while True:
            state = await self.keys.choose()
            hooks = self.gate.hooks(state, first_429, at_turn)
            try:
                return await self._send_on(state, hooks, key, request, kind)
            except KeyOut:
                first_429 = hooks.first_429
                continue
            finally:
                self.keys.release(state)

    async def _send_on(
        self, state: LaneState, hooks: LaneHooks, key: str, request: PreparedRequest, kind: str
    ) -> Answer:
        first = state.first
        is_first = await first.turn()
        permanent = False
        try:
            if self.stopped.is_set():
                raise asyncio.CancelledError
            try:
                summary, attempts = await state.lane.client.send(request, hooks=hooks)
                answer, permanent = Answer(summary, OK, None, None, 200, attempts), True
                first.key_answered()
                self.answers.trust()  # answered in the run's mode: the store may answer the rest
            except TurnGiven:
                if is_first:  # the key's first request did not go: the next one is the first
                    is_first = False
                    first.given_back()
                    self.keys.changed()
                raise
            except (AuthenticationError, NotPremiumError) as exc:
                first.key_refused(exc)
                if self.keys.refuse(state, exc):  # another key is left: this request goes there
                    raise KeyOut from None
                self.stats.sent += 1
                self.stop(exc)
                raise
            except (BudgetError, RunCancelled) as exc:  # the budget out past budget_wait, or the job stopped
                self.stop(exc)  # nothing more starts
                raise
            except APIError as exc:
                answer, permanent = _failure(exc), _is_permanent(exc)
            self.stats.sent += 1  # counted once it reached the service, not while it waited its turn
            self.stats.sent_by_kind[kind] += 1
            self.stats.attempts += answer.attempts
        finally:
            if is_first:
                first.done()
                self.keys.changed()
        if permanent:
            self.answers.put(key, answer)
        return answer

    def stop_sending(self) -> list[asyncio.Task[Answer]]:
        """Start nothing new; cancel what is not on the wire; the tasks still on the wire."""
        self.gate.closing = True
        tasks = set(self.under_way.values())
        for task in tasks - self.gate.on_wire - {asyncio.current_task()}:
            task.cancel()
        return [task for task in tasks & self.gate.on_wire if not task.done()]
