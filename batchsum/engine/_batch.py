"""One run of the engine (``Batch``): its parts wired together (answers, gate, stop, requests, rows in)
and its end: a stop from whichever part notices it first, then the close that drains and cancels."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ..data.stores import AnswerStore
from ..service import contract
from ..service.errors import BatchsumError, JournalError, RequestCapReached
from ._answers import Answers
from ._gate import Gate
from ._intake import Intake
from ._keys import FirstRequest, Keys
from ._requests import Requests
from ._stop import Stop
from ._window import Known, Pending
from .lanes import KeyLane
from .options import RunOptions
from .tally import BatchStats

__all__ = ["Batch"]

log = logging.getLogger("batchsum")


class Batch:
    """One run of the engine: rows in (``intake``), requests out (``requests``, through ``gate``), the
    answers kept (``answers``); and the stop (``halt``): why, what is still awaited on the wire, and
    what is cancelled."""

    def __init__(
        self,
        lanes: list[KeyLane],
        params: contract.Params,
        options: RunOptions,
        store: AnswerStore,
        stats: BatchStats,
    ) -> None:
        self.options = options
        mode = params.mode
        self.answers = Answers(store, self.stop)  # what the store serves it: its scopes' ``Trust``
        firsts = [
            FirstRequest(lane.record, mode, alone=lane.record is None or lane.record.proven(mode) is None)
            for lane in lanes
        ]
        self.keys = Keys(list(zip(lanes, firsts)), options.max_wait, self.cap_reached, stats)
        self.gate = Gate(self.keys, options.max_wait, stats=stats, cap=options.max_requests, on_cap=self.cap_reached)
        self.halt = Stop(self.gate.on_wire, options.drain_seconds)
        self.requests = Requests(self.keys, stats, self.answers, self.gate, self.halt.stopped, self.stop)
        self.intake = Intake(params, options, stats, self.requests, self.halt)

    def stop(self, error: BatchsumError, *, unsent_rows: bool = False) -> None:
        """Stop at once: nothing new starts from here on, whoever notices the stop first.
        ``unsent_rows``: the rows already read still get a record each (``failed``, ``not_sent``)
        before the error is raised, so that an output can hold every row read."""
        self.halt.set(error, unsent_rows=unsent_rows)
        self.requests.stop_sending()

    def cap_reached(self, error: RequestCapReached) -> None:
        """The cap (or every key's quota: ``QuotaSpent``) is used up: stop, and give every row, read
        or not yet, its record."""
        self.stop(error, unsent_rows=True)

    async def close(self, pending: deque[Pending | Known]) -> None:
        """Let requests on the wire finish (the service charges for them) and keep their answers,
        unless the key was refused; then cancel the rest. A second Ctrl-C aborts at once."""
        on_wire = self.requests.stop_sending()
        tasks: set[asyncio.Task[Any]] = {item for item in pending if isinstance(item, asyncio.Task)}
        tasks |= set(self.requests.under_way.values())
        if on_wire and self.halt.drains():
            log.info("waiting up to %gs for %d requests on the wire", self.options.drain_seconds, len(on_wire))
            await asyncio.wait(on_wire, timeout=self.options.drain_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.gate.quotas.close()  # counts given back on a configured quota (the budget closes next)
        spilled = await self.answers.close()
        if spilled is not None and isinstance(self.halt.fatal, JournalError):
            count = len(self.answers.unsaved)
            self.halt.fatal.args = (
                f"{self.halt.fatal}; the {count} answers it could not take are kept in {spilled}, "
                "which the next run imports first",
            )
