"""A batch kept open for requests that come one at a time, from any number of callers at once, each
answered as soon as it is (``OpenBatch``: ``batchsum gateway``'s). Its requests go the way every
run's go (known, joined while under way, the store looked up and claimed at the turn, the gate with
the key's quotas, the key's pacer, the client's retries); its stop and its end are a batch's."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from ..data.results import Answer
from ..data.scopes import Scopes, Trust, trusting
from ..data.stores import AnswerStore
from ..service import contract
from ..service.errors import BatchsumError
from ._batch import Batch
from ._requests import ROW
from .lanes import KeyLane
from .options import RunOptions
from .tally import BatchStats

__all__ = ["OpenBatch"]


class OpenBatch:
    """One batch over a run's ``lanes`` (its keys), for requests in ``mode``, any percentage and type.
    The store answers it once one of its keys is proven in ``mode`` (by its record, or the batch's
    first answer): its keys are its clients', and a key the service never accepted, or whose plan
    refuses the mode, is served no answer another key paid for. ``request`` gives a request's answer, or the task that gives
    it; ``stopped`` says what stopped the batch (a refused key, a quota spent past ``max_wait``, the
    budget lost past ``budget_wait``): nothing new starts in it, and its caller opens the next."""

    def __init__(
        self, lanes: Sequence[KeyLane], mode: int, options: RunOptions, store: AnswerStore, stats: BatchStats
    ) -> None:
        self.stats = stats
        # Its keys are its clients': the store answers a key only once it is proven in the mode (its
        # record, or this batch's first answer), so a key the service never accepted is served nothing.
        trust = Trust.of(mode, (lane.record for lane in lanes), strangers=True)
        scopes = trusting(store, trust) if isinstance(store, Scopes) else Scopes(store, trust=trust)
        self._batch = Batch(list(lanes), contract.parse_params(mode), options, scopes, stats)

    @property
    def stopped(self) -> BatchsumError | None:
        """What stopped the batch, once something did."""
        return self._batch.halt.fatal

    def request(self, text: str, params: contract.Params) -> Answer | asyncio.Task[Answer]:
        """The answer to one request (``text`` within the word limits, ``params`` in this batch's mode):
        known at once, or the task that gives it (one an identical request under way already has)."""
        item = self._batch.requests.request(text, params, ROW)
        assert item is not None  # a new request is allowed here
        return item

    def on_wire(self, task: asyncio.Task[Answer]) -> bool:
        """Whether ``task``'s request is on the wire now (its turn came): a stop waits for its answer."""
        return task in self._batch.gate.on_wire

    def count(self, answer: Answer, sent: bool) -> None:
        """One request answered (``sent``: by the service, not the store): counted as a run's row."""
        self.stats.count(answer.row(1 if sent else 0))

    async def close(self) -> None:
        """The requests on the wire awaited (within the drain time) and their answers kept, the rest
        cancelled, the store's queue sent; the keys' pacers are the run's to close."""
        await self._batch.close(deque())
