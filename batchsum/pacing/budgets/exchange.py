"""What a pacer and its key's budget exchange: the ``Budget`` protocol, the report a pacer pushes,
the slot it gets back, a run's share of the key, the lead of the key's search (``Lead``), the
entries remembered of a key at a service, and the runs' registry (``Member``, ``RunEntry``): who is
on the key, their job's stop, and the budget's epoch (a new one: it came back empty). A budget's
calls go through its ``outage`` (``outage.py``): one that cannot be reached mid-run is waited for.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ledger import LEDGER_SECONDS, Ledger
from .outage import BudgetUnreachable, Outage

__all__ = [
    "Budget",
    "Report",
    "NO_REPORT",
    "Slot",
    "Share",
    "Remembered",
    "Lead",
    "Member",
    "RunEntry",
    "BudgetReset",
    "BudgetUnreachable",
    "QuotaCounts",
    "LEASE_SECONDS",
    "RUN_LEASE_SECONDS",
    "STOP_SECONDS",
    "ENTRY_CHARS",
    "SHARED_SECONDS",
    "LOOK",
    "RESERVE",
    "COMMIT",
    "RESERVE_ONLY",
    "AHEAD",
    "RECORD_SECONDS",
    "SETTING",
]

RECORD_SECONDS = 7 * 86400  # remembered entries older than this are dropped (readers use their own ages)
LEASE_SECONDS = 15.0  # a lead not renewed for this long has lapsed (its holder renews it every second)
SHARED_SECONDS = 300.0  # a shared pace or a search's state not written for this long is not adopted
SETTING = "--budget (or $BATCHSUM_BUDGET)"
RUN_LEASE_SECONDS = 15.0  # a run's entry not published again for this long has lapsed (it publishes every second)
STOP_SECONDS = 86400  # a job's stop is kept this long on the budget
ENTRY_CHARS = 4096  # a run's entry longer than this is not kept (it is plain, short JSON)


@dataclass(frozen=True)
class Member:
    """A run's presence on a key's budget: ``run_id`` (every process of a Dask, Spark or Ray job shares
    its job's) and ``member``, this process's part of it (one entry each in the runs' registry)."""

    run_id: str
    member: str


@dataclass(frozen=True)
class RunEntry:
    """One process of a run on the key, as it last published itself: its ``run_id`` and ``member``,
    what it said (``data``: plain JSON, never a secret: host, pid, door, output, rpm, share, sent ...),
    and when, on the budget's clock (``seen``; ``now``: the budget's clock when read)."""

    run_id: str
    member: str
    data: Mapping[str, Any]
    seen: float
    now: float

    @property
    def share(self) -> float:
        """The share of the key this run may use (1 without one)."""
        try:
            value = float(self.data.get("share") or 1.0)
        except (TypeError, ValueError):
            return 1.0
        return value if 0 < value <= 1 else 1.0

    @classmethod
    def read(cls, run_id: str, member: str, text: str, seen: float, now: float) -> RunEntry | None:
        """The entry stored as ``text``; None when it does not read as one (damaged, or a later version's)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        return cls(run_id, member, data, seen, now) if isinstance(data, dict) else None


class BudgetReset(Exception):
    """The budget's epoch is not the one the caller knows: it came back empty (a Redis restarted
    without its data). Nothing was counted; ``epoch`` is the budget's new one."""

    def __init__(self, epoch: str) -> None:
        super().__init__(f"the rate budget came back empty (epoch {epoch})")
        self.epoch = epoch


@dataclass(frozen=True)
class QuotaCounts:
    """What a quota claim found on the budget: the ``epoch`` it was made on, each period's count after
    it (``counts``, in the order asked), and whether it counted (``counted``; False: the first period
    held the limit already, and nothing was counted)."""

    epoch: str
    counts: tuple[int, ...]
    counted: bool


class QuotaBook:
    """A key's quota counts kept in memory (a budget in this process): each period's ``counts``, and
    what was ``restored`` of each old epoch's (epoch, period -> the count added for it)."""

    __slots__ = ("counts", "restored")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.restored: dict[tuple[str, str], int] = {}

    def claim(self, periods: Sequence[tuple[str, float]], limit: int | None) -> tuple[tuple[int, ...], bool]:
        counted = limit is None or self.counts.get(periods[0][0], 0) < limit
        if counted:
            for name, _ in periods:
                self.counts[name] = self.counts.get(name, 0) + 1
        return tuple(self.counts.get(name, 0) for name, _ in periods), counted

    def give_back(self, periods: Sequence[str]) -> None:
        for name in periods:
            self.counts[name] = max(0, self.counts.get(name, 0) - 1)

    def restore(self, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
        for name, count, _ in counts:
            done = self.restored.get((old, name), 0)
            if count > done:
                self.counts[name] = self.counts.get(name, 0) + count - done
                self.restored[(old, name)] = count


@dataclass(frozen=True)
class Report:
    """What a pacer tells the budget with its next reservation: a pause it must share, a pace it
    set, and how its attempts ended since its last report: the ages (seconds before this report) of
    the starts answered clean (``answered``) and answered 429 (``refused``), which the budget counts
    at the tick of each start. (The starts themselves are counted by the budget when committed; a
    start reserved ahead, never committed, is told by its age in ``started``.) A pace
    lowered on evidence always applies; a pace raised while climbing (``pace_base``: the version it
    climbed from) applies only if nobody wrote one since, so a climb never undoes another's lowering."""

    pause_for: float = 0.0
    pause_reason: str | None = None
    pace: float | None = None
    pace_base: int | None = None
    answered: tuple[float, ...] = ()
    refused: tuple[float, ...] = ()
    started: tuple[float, ...] = ()  # starts reserved ahead (``AHEAD``) that went out, by age
    run: Member | None = None  # the run calling: its job's stop is looked up (``Slot.stop``)
    entry: str | None = None  # the run's entry to publish (plain JSON), at most once a second
    asker: str = ""  # the pacer asking (a token of its own): a far batch run a start is kept for (``gcra``)

    def ended(self) -> bool:
        """Whether it tells of attempts that ended (or of starts reserved ahead that went out)."""
        return bool(self.answered or self.refused or self.started)


NO_REPORT = Report()


@dataclass(frozen=True)
class Share:
    """A run that may use only ``fraction`` of the key's rate; ``holder`` names it (one name for
    every partition of a Dask or Spark job)."""

    holder: str
    fraction: float

    def own_interval(self, interval: float) -> float:
        """The spacing of this run's own starts when the key's are ``interval`` apart."""
        return max(0.0, interval) / self.fraction


@dataclass(frozen=True)
class Slot:
    """A reservation (or a look, ``start=False``): the wait until the start, and the budget's state."""

    wait: float
    at: float | None  # the reserved start on the budget's clock (None: a look)
    paused_for: float  # seconds of the shared pause left (0: none)
    pause_mark: float  # when the pause in force ends, on the budget's clock: a new value is a new pause
    pause_reason: str | None
    pace: float | None  # the shared pace in force; None: nobody set one
    pace_version: int  # bumped at every pace written: a value not seen before is someone else's
    starts: int  # attempts started in the last minute, every process together
    refused: int  # of those, answered 429 (as reported so far)
    answered: int = 0  # of those, answered clean (as reported so far)
    deferred: bool = False  # a shared run's own turn has not come: nothing reserved; ask again after ``wait``
    committed: bool = False  # the start is recorded as the key's last: it goes now (``wait`` is 0)
    epoch: str = ""  # the budget's epoch: another than the one first seen means it came back empty
    stop: str | None = None  # the calling run's job was stopped (``post_stop``): its cause
    live: bool = False  # reserved ahead of the batch runs (the live lane's): commit it with ``live``
    live_open: bool = False  # a live lane is open on the key: a far batch run reserves each start just in time


@dataclass(frozen=True)
class Remembered:
    """One remembered entry of a (key, service) pair: ``name`` (``answered:1``, ``room_contradicted``,
    ``limit`` ...), its ``value`` (plain text, often JSON) and when it was written (Unix time)."""

    key_hash: str
    service: str
    name: str
    value: str
    at: float


@dataclass(frozen=True)
class Lead:
    """Who leads the key's search under ``--rpm auto`` (``holder``; None: nobody), the state it last
    published (``state``, plain text, written at ``state_at``; None when older than
    ``SHARED_SECONDS``), and the budget's clock when asked (``now``)."""

    holder: str | None
    state: str | None
    state_at: float
    now: float


# What a call to the budget does besides taking the report: look; reserve (committed at once when
# due now); commit; reserve and never commit at once (the caller asks first whether the attempt
# still goes); reserve the next ``count`` starts ahead, each an interval after the one before and
# recorded as the key's last at once (a far budget's: ``Budget.far``; the starts that went out are
# told afterwards, by age).
LOOK, RESERVE, COMMIT, RESERVE_ONLY, AHEAD = 0, 1, 2, 3, 4


def _lane(live: float) -> dict[str, Any]:
    """A call's live part, told only when there is one (a budget of a test's own may know no lane)."""
    return {"live": live} if live > 0 else {}


class Budget(abc.ABC):
    """Gives the next start time for a key. ``shared``: other processes may use it too."""

    shared = True
    where = ""  # for messages: "this process", "this machine (PATH)", "redis://host:port/db"
    epoch = ""  # the epoch the budget last answered with (a budget in memory: its own, made with it)
    # Calls cross a network (Redis): a pacer reserves its next starts ahead (``AHEAD``), a few in one
    # call, and tells afterwards which went out, instead of a round trip to commit each before it goes.
    far = False

    @property
    def outage(self) -> Outage:
        """The budget's outage, if any (``outage.Outage``): waited for up to a run's ``budget_wait``."""
        outage: Outage | None = self.__dict__.get("_outage")
        if outage is None:
            outage = self.__dict__["_outage"] = Outage(self.where)
        return outage

    async def reserve(
        self,
        interval: float,
        report: Report = NO_REPORT,
        *,
        start: bool = True,
        share: Share | None = None,
        commit: bool = True,
        ahead: int = 0,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        """Push ``report``; reserve a start ``interval`` seconds after the key's previous one
        (``start``; else only look). With ``share``, only once the shared run's own turn has come
        (else a ``deferred`` slot). A start due at once comes back ``committed`` (unless not
        ``commit``); any other must be committed when its wait is over (``commit``). ``ahead``: the
        next ``ahead`` starts instead, at ``at``, ``at + interval`` ..., the first at least ``lead``
        seconds from now (the time the answer takes to reach the caller): ``AHEAD``, nothing to commit;
        tell each that went out with a later report's ``started``. ``live``: a live request's (its part
        of the key), ahead of the batch runs' reserved starts while the live lane has room (``gcra.py``;
        ``Slot.live`` says if it was); a far batch reservation may be ``deferred`` for the lane."""
        what = (AHEAD if ahead > 0 else RESERVE if commit else RESERVE_ONLY) if start else LOOK
        extra: dict[str, Any] = {"count": ahead, "lead": lead} if what == AHEAD else {}
        return await self._call(what, interval, report, share, **extra, **_lane(live if start else 0.0))

    async def commit(
        self, interval: float, report: Report = NO_REPORT, *, share: Share | None = None, live: float = 0.0
    ) -> Slot:
        """Push ``report``; record a start now if the key's last committed start is ``interval``
        back and no pause holds (``committed``), else the ``wait`` before trying again. ``live``: the
        commit of a start reserved ahead of the batch runs (``Slot.live``): the live start held is its own."""
        return await self._call(COMMIT, interval, report, share, **_lane(live))

    @abc.abstractmethod
    async def _call(
        self,
        what: int,
        interval: float,
        report: Report,
        share: Share | None,
        count: int = 1,
        lead: float = 0.0,
        live: float = 0.0,
    ) -> Slot:
        """One atomic step on the budget's state: ``LOOK``, ``RESERVE``, ``COMMIT`` or ``AHEAD``
        (``count`` starts, the first at least ``lead`` from now), a live caller's (``live``) or not."""

    async def check(self) -> None:
        """Raise ``BudgetError`` when the budget cannot be used (before anything is sent)."""
        await self.reserve(0.0, start=False)

    async def look(self) -> Slot:
        """The budget's state now, reserving nothing and creating nothing (``--dry-run``)."""
        return await self.reserve(0.0, start=False)

    async def ledger(self, seconds: float = LEDGER_SECONDS) -> Ledger:
        """The key's counts of the last ``seconds``, every process together (``ledger.Ledger``)."""
        return Ledger.empty(0.0)

    async def lead(self, holder: str, state: str | None = None, *, release: bool = False) -> Lead:
        """Ask for the lead of the key's search as ``holder``: granted when nobody holds it, its
        lease lapsed, or ``holder`` has it (renewed for ``LEASE_SECONDS``); ``state``, the holder's
        to publish (kept with the lead). ``release``: the holder lets it go (its state stays for a
        successor). What the budget holds after the call."""
        return Lead(holder, state, 0.0, 0.0)

    async def recall(self, key_hash: str, service: str) -> list[Remembered]:
        """What is remembered of ``key_hash`` at ``service`` (nothing, for a budget that remembers nothing)."""
        return []

    async def remember(self, key_hash: str, service: str, entries: dict[str, str]) -> None:  # noqa: B027
        """Remember ``entries`` (name -> value) of ``key_hash`` at ``service``, stamped now."""

    async def remembered(self) -> list[Remembered]:
        """Every entry remembered, of every key and service (``batchsum limits``)."""
        return []

    async def rewrite(self, entries: Sequence[Remembered]) -> None:  # noqa: B027 - remembers nothing
        """Write ``entries`` again with their own stamps, none over a newer one of the same name: what
        a run knew of the key, into a budget that came back empty."""

    async def forget(self, key_hash: str | None = None, service: str | None = None, name: str | None = None) -> int:
        """Forget the entries that match (None matches all), and with no ``name``, the shared pace,
        counts and search of the keys' budgets there too; how many entries were forgotten."""
        return 0

    # The key's paid requests per UTC period (``pacing.budgets.quota.CountedQuota``), the count a configured
    # quota is held to. This default keeps it in the budget object (this process: ``QuotaBook``); the
    # shared budgets keep it where they live. What was restored of an old epoch's counts lives beside
    # them, so it goes when they go (a budget that comes back empty again has restored nothing).

    async def quota_claim(
        self, periods: Sequence[tuple[str, float]], limit: int | None, epoch: str | None = None
    ) -> QuotaCounts:
        """Count one paid request in each of ``periods`` (a name and the seconds the count must
        outlive: its period's end), unless the first holds ``limit`` already (nothing counted).
        ``limit`` None: count, never refuse. ``epoch``: the budget's epoch as the caller knows it; on
        another, nothing is counted and ``BudgetReset`` is raised (what the caller counted on the old
        one is to be restored: ``quota_restore``)."""
        if epoch is not None and epoch != self.epoch:
            raise BudgetReset(self.epoch)
        return QuotaCounts(self.epoch, *self._quota_book.claim(periods, limit))

    async def quota_give_back(self, periods: Sequence[str]) -> None:
        """Uncount one request of each of ``periods`` the service did not charge for (a 429)."""
        self._quota_book.give_back(periods)

    async def quota_used(self, period: str) -> int:
        """Requests counted in ``period`` so far (``--dry-run``, ``batchsum limits``)."""
        return self._quota_book.counts.get(period, 0)

    async def quota_restore(self, into: str, old: str, counts: Sequence[tuple[str, int, float]]) -> None:
        """What a run saw counted on the epoch ``old`` (each period's name, its count, and the seconds
        it must be kept) added to the counts of the budget's epoch now, ``into`` (on another,
        ``BudgetReset``: it came back empty again), less what was restored of ``old`` already: each old
        epoch's count is restored once, however many runs remember it (the most any of them saw)."""
        if into != self.epoch:
            raise BudgetReset(self.epoch)
        self._quota_book.restore(old, counts)

    @property
    def _quota_book(self) -> QuotaBook:
        book: QuotaBook = self.__dict__.setdefault("_quota_book", QuotaBook())
        return book

    # The runs' registry: who is on the key (published with the calls a run makes anyway: ``Report.entry``),
    # and a job's stop (``Slot.stop``, for the run named by ``Report.run``).

    async def runs(self) -> list[RunEntry]:
        """The runs on the key whose entries have not lapsed (``RUN_LEASE_SECONDS``), every process's."""
        return []

    async def leave(self, member: Member) -> None:  # noqa: B027 - a budget with no registry has nothing to remove
        """``member``'s entry removed (its run ended)."""

    async def post_stop(self, run_id: str, cause: str) -> None:  # noqa: B027
        """Stop the job ``run_id``: each of its runs on the key hears ``cause`` on its next call."""

    async def aclose(self) -> None:  # noqa: B027 - most budgets hold nothing to let go of
        """Let go of connections (the budget's state stays for the others)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where})"
