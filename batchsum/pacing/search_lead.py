"""The key's one search under ``--rpm auto``: every run on the key asks its budget for the lead once a
second (a lease that lapses ``LEASE_SECONDS`` after its holder stops renewing it); the run that holds
it reads the key's ledger, moves the limit (``limit.AutoLimit``) and publishes it with the pace; the
others follow what it published. When the leader ends or dies, a follower takes the lead over with
the state it last published, so a search in progress is never restarted.

Invariant: only the run holding the lead moves the limit, writes it to the key's record, or sets the
pace it follows; a follower's pace is the published one (and its own share of it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from ..service.errors import BudgetError
from .auto.handover import published, taken_on
from .auto.key_record import KeyRecord
from .auto.limit import AutoLimit
from .budgets.exchange import LOOK, SHARED_SECONDS, Budget
from .paces import Paces
from .sharing import Sharing

__all__ = ["Lead", "TICK_SECONDS", "key_share"]

log = logging.getLogger("batchsum")

TICK_SECONDS = 1.0  # every run on the key looks at its lead this often
REPUBLISH_SECONDS = SHARED_SECONDS / 3  # the lead writes its state again at least this often


async def key_share(budget: Budget, own: float) -> float:
    """What the runs on the key may send together, as a share of the key's pace: the shares of the
    live runs on the budget's registry summed (1 for a run without one), at most 1, and never less
    than this run's ``own``; ``own`` while the budget keeps no registry (a run alone on the key)."""
    runs = getattr(budget, "runs", None)
    if runs is None:
        return own
    total = 0.0
    for entry in await runs():
        share = entry.get("share") if isinstance(entry, dict) else getattr(entry, "share", None)
        total += float(share) if isinstance(share, (int, float)) and 0 < share < 1 else 1.0
    return min(1.0, max(total, own))


@dataclass(eq=False, slots=True)
class Lead:
    """A pacer's part in its key's one search: leading it or following it (``leading``), ticking
    while the pacer sends. ``last_start``: the pacer's last start (for the exchange a tick makes)."""

    clock: Callable[[], float]
    budget: Budget
    auto: AutoLimit
    paces: Paces
    sharing: Sharing
    record: KeyRecord | None
    last_start: Callable[[], float]
    holder: str = field(default_factory=lambda: secrets.token_hex(8))
    leading: bool = False
    published: str | None = None
    _task: asyncio.Task[None] | None = None
    _ready: asyncio.Event | None = None

    async def start(self) -> None:
        """Take part (once per batch): a first look before the first start, so that it goes at the
        key's level, then a look every ``TICK_SECONDS`` until ``close``."""
        if self._task is None or self._ready is None:
            self._ready = asyncio.Event()
            self._task = asyncio.ensure_future(self._ticking(self._ready))
        await self._ready.wait()

    async def _ticking(self, ready: asyncio.Event) -> None:
        while True:
            try:
                await self.tick()
            except BudgetError as exc:  # the run finds out for itself at its next start
                log.debug("the key's lead could not be looked at: %s", exc)
            except Exception:  # a fault of ours: never a run that waits forever, or two that lead
                log.warning("the key's search under --rpm auto failed; this run keeps its pace", exc_info=True)
                self.leading = False
                ready.set()
                return
            ready.set()
            await asyncio.sleep(TICK_SECONDS)

    async def tick(self) -> None:
        """Tell the budget what this run owes it (its answers go to the key's ledger), renew or ask for
        the lead; then lead (a look at the ledger, the limit moved and published) or follow (the
        published limit taken on)."""
        await self.sharing.exchange(LOOK, 0.0, self.last_start())
        sending = await key_share(self.budget, self.sharing.share.fraction if self.sharing.share else 1.0)
        if sending != self.auto.sending:
            self.auto.sending = sending
            if self.auto.searching:
                self.moved(None, publish=self.leading)  # the key's pace that sends the level
        view = await self.budget.lead(self.holder)
        took_over = view.holder == self.holder and not self.leading
        self.leading = view.holder == self.holder
        if self.leading:
            if took_over and view.state is not None and view.state != self.published:
                self._follow(view.state, resume=True)  # a search in progress is carried on, not restarted
            elif took_over and view.state is None and self.published is not None:
                self._follow(self.published, resume=True)  # the budget came back empty: led on from what we followed
            why = self.auto.step(await self.budget.ledger())
            if why is not None:
                self.moved(why)
            state = published(self.auto)
            # Written again before it ages out (SHARED_SECONDS): a settled limit changes for minutes
            # on end, and a run joining then would find no state to follow.
            if state != self.published or view.state is None or view.now - view.state_at > REPUBLISH_SECONDS:
                self.published = state
                await self.budget.lead(self.holder, state)
        elif view.state is not None and view.state != self.published:
            self._follow(view.state)

    def _follow(self, state: str, *, resume: bool = False) -> None:
        """Take on a limit (or a search) another run published (``resume``: to lead it on)."""
        self.published = state
        before = (self.auto.value, self.auto.origin)
        if taken_on(self.auto, state, resume=resume):
            moved = (self.auto.value, self.auto.origin) != before and self.auto.value is not None
            self.moved("as the run leading the key's search found" if moved else None, publish=False)

    def moved(self, why: str | None, *, publish: bool = True) -> None:
        """The limit or the level moved (``why``; None: a step not worth a line): the pace follows it,
        and a limit found goes to the record (by the lead only)."""
        auto, paces, now = self.auto, self.paces, self.clock()
        paces.ceiling = auto.ceiling()
        found, auto.found = auto.found, None
        if found is not None and self.record is not None and publish:
            self.record.limit_found(found)
        reason = f"limit {auto.describe()}: {why}" if why is not None and not auto.searching else None
        paces.set(auto.pace(), reason, now, publish=publish)

    async def close(self) -> None:
        """Stop ticking; the lead, if held, goes with the state for a successor."""
        task, self._task, self._ready = self._task, None, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self.leading:
            self.leading = False
            partly = self.auto.partly_found()
            if partly is not None and self.record is not None:
                self.record.limit_found(partly)  # told with the batch's last exchange
            try:
                await self.budget.lead(self.holder, published(self.auto), release=True)
            except BudgetError as exc:
                log.debug("the key's lead could not be let go: %s", exc)
