"""A run's keys as the engine sends on them (``KeyLane``: one key's client, pacer, budget and record,
its own counts, whether it was refused or its quota spent), and the run's pace over all of them
(``Pacers``: what a progress line, the report and the metrics read, as of one pacer)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..pacing import KeyRecord, PaceChange, Pacer, PacerState
from ..pacing.auto.sources import Source
from ..pacing.budgets.exchange import Budget
from ..pacing.budgets.quota import CountedQuota, Spent, StatedQuota, utc
from ..service.client import AsyncClient
from ..service.errors import BudgetError
from ..service.key_plans import Quota
from ..service.settings import ENV_API_KEY

__all__ = ["KeyLane", "Pacers", "KeysState", "finish_lanes"]

log = logging.getLogger("batchsum")


@dataclass(eq=False)
class KeyLane:
    """One key of a run: its ``client`` (the key in its Authorization header), ``pacer`` (on the key's
    own ``budget``, shared with every process and machine using the key), ``record`` at the service,
    its short ``key_hash`` and ``source`` (where it came from), its configured ``quota``; ``tell``
    hears a line for a person when the key leaves the run or comes back. The engine counts on it:
    ``requests`` (attempts), ``rate_limited`` (429s), ``refusal`` (the service's message when it
    refused the key), ``spent`` (the last quota spent, until when; ``spent_now`` while it lasts)."""

    client: AsyncClient
    pacer: Pacer
    record: KeyRecord | None = None
    key_hash: str = ""
    source: str = ""
    quota: Quota | None = None
    budget: Budget | None = None
    tell: Callable[[str], None] | None = None
    requests: int = 0
    rate_limited: int = 0
    refusal: str | None = None
    spent: Spent | None = None
    out_until: float = -math.inf  # on the pacer's clock: out of the run until then (inf: refused)
    stated: StatedQuota = field(default_factory=StatedQuota)
    counted: CountedQuota | None = None

    def __post_init__(self) -> None:
        if self.budget is not None and self.counted is None:  # every run counts what it pays on the key
            self.counted = CountedQuota(self.quota, self.budget)

    @property
    def listed(self) -> bool:
        """A key of a list (a key file, ``$BATCHSUM_API_KEYS``, ``api_key=[...]``), not the one key of
        ``api_key`` or ``$BATCHSUM_API_KEY``."""
        return self.source not in ("", "api_key", f"${ENV_API_KEY}")

    @property
    def name(self) -> str:
        """``key 3f2a9c1b7d0e (keys.txt line 2)``: how a line names the key, never a piece of it."""
        return f"key {self.key_hash}" + (f" ({self.source})" if self.source else "")

    def limit(self) -> float:
        """The key's limit in force, requests a minute (0: no pacing)."""
        return self.pacer.ceiling

    def limit_source(self) -> Source | None:
        """Where the key's limit in force came from (``pacing.auto.sources``; None: no pacing)."""
        if self.pacer.auto is not None:
            return self.pacer.auto.source
        return Source.configured() if self.pacer.rpm else None

    def spent_now(self) -> Spent | None:
        """``spent`` while the key is out for it (a key back from a quota's reset has none)."""
        return self.spent if self.spent is not None and self.out_until > self.pacer.now() else None

    def quota_line(self) -> str | None:
        """What is known of the key's quota now, in words (None: nothing)."""
        if (spent := self.spent_now()) is not None:
            return f"{spent.name} spent until {utc(spent.until)}"
        stated = self.stated.describe()
        if stated is not None:
            return stated
        return self.counted.describe() if self.counted is not None else None  # None: no quota configured

    def describe(self) -> dict[str, Any]:
        """The key in the run report and the JSON log: never the key, its hash."""
        return {
            "hash": self.key_hash,
            "source": self.source,
            "limit": self.limit() or None,
            "limit_source": None if (source := self.limit_source()) is None else source.kind,
            "limit_detail": None if source is None else source.detail(),
            "requests": self.requests,
            "rate_limited": self.rate_limited,
            "refusal": self.refusal,
            "quota": self.quota_line(),
            "quota_spent_until": None if (spent := self.spent_now()) is None else utc(spent.until),
        }

    def state(self) -> str:
        """``3f2a9c1b7d0e 120/min 41 sent`` for the progress line."""
        if self.refusal is not None:
            return f"{self.key_hash} refused"
        if (spent := self.spent_now()) is not None:
            return f"{self.key_hash} quota spent until {utc(spent.until)}"
        limit = self.limit()
        rate = f"{limit:.0f}/min" if limit else "unpaced"
        refused = f", {self.rate_limited} 429s" if self.rate_limited else ""
        return f"{self.key_hash} {rate} {self.requests} sent{refused}"


@dataclass(frozen=True)
class KeysState(PacerState):
    """A run's state over several keys: the sums, and each key's own (``keys``)."""

    keys: tuple[str, ...] = ()

    def describe(self) -> str:
        return super().describe() + " · keys: " + " | ".join(self.keys)


class Pacers:
    """Several keys' pacers read as one (``BatchStats.pacer``): the pace is the sum of the paces of
    the keys still in the run, 429s and changes every key's (each change named by its key)."""

    __slots__ = ("lanes", "auto")

    def __init__(self, lanes: Sequence[KeyLane]) -> None:
        self.lanes = list(lanes)
        self.auto = None  # each key's limit has its own source: see ``lanes``

    def _live(self) -> list[KeyLane]:
        now = self.now()
        return [lane for lane in self.lanes if lane.out_until <= now] or self.lanes

    @property
    def rpm(self) -> float:
        return sum(lane.pacer.rpm for lane in self.lanes)

    @property
    def pace(self) -> float:
        return sum(lane.pacer.pace for lane in self._live() if lane.out_until <= self.now())

    @property
    def ceiling(self) -> float:
        return sum(lane.limit() for lane in self._live())

    @property
    def rate_limited(self) -> int:
        return sum(lane.rate_limited for lane in self.lanes)

    @property
    def changes(self) -> list[PaceChange]:
        out = []
        for lane in self.lanes:
            out += [
                PaceChange(c.at, c.pace, c.previous, f"key {lane.key_hash}: {c.reason}") for c in lane.pacer.changes
            ]
        return sorted(out, key=lambda change: change.at)

    @property
    def in_flight(self) -> _Wire:
        return _Wire(self.lanes)

    def now(self) -> float:
        return self.lanes[0].pacer.now()

    def state(self) -> KeysState:
        states = [lane.pacer.state() for lane in self._live()]
        paused = min(states, key=lambda s: s.paused_for)
        return KeysState(
            rpm=self.rpm,
            pace=self.pace,
            paused_for=paused.paused_for,
            pause_reason=paused.pause_reason,
            in_flight=sum(s.in_flight for s in states),
            in_flight_limit=sum(s.in_flight_limit for s in states),
            rate_limited=self.rate_limited,
            budget=next((s.budget for s in states if s.budget is not None), None),
            keys=tuple(lane.state() for lane in self.lanes),
        )


class _Wire:
    """What is on the wire over every key."""

    __slots__ = ("lanes",)

    def __init__(self, lanes: list[KeyLane]) -> None:
        self.lanes = lanes

    @property
    def on_wire(self) -> int:
        return sum(lane.pacer.in_flight.on_wire for lane in self.lanes)


async def finish_lanes(lanes: Sequence[KeyLane]) -> None:
    """What a batch's keys tell at its end: each key's quota as it ends (not one that resets within a
    pause) to its record, and its pacer's last words to its budget. A budget gone is only said: its
    counts are advice."""
    for lane in lanes:
        try:
            stated = lane.stated
            if lane.record is not None and stated.left is not None and stated.lasts(lane.pacer.now()):
                lane.record.quota_stated(lane.stated)
            await lane.pacer.flush()
        except BudgetError as exc:
            log.warning("%s", exc)
