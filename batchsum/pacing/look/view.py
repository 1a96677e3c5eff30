"""What a budget shows of its keys and the runs on them (``read_view``): per key (``KeyView``) the limit
in force and its source (each, when its runs disagree), its starts in the last 10 s and minute and its
429s, a pause and its end, its quotas (what is left, the reset), a search under way, and its runs
(``RunView``: a job's processes as one run); as plain data for ``batchsum top``, ``batchsum.monitor()``
and the metrics. Read from ``readonly.py``: reading never writes the budget.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...service.errors import InvalidParameterError
from ...service.key_plans import parse_quota, period_window
from ...service.location import Location
from ..auto.key_record import LIMIT, QUOTA, QUOTA_SPENT
from ..auto.limit import Found
from ..auto.sources import KINDS
from ..budgets.exchange import RunEntry
from ..budgets.ledger import TICK
from ..budgets.quota import Spent, window_name
from .readonly import KeyState, read_states

__all__ = ["KeyView", "RunView", "LimitView", "QuotaView", "read_view", "key_view", "source_word", "UNKNOWN", "BUCKET"]

UNKNOWN = "unknown"  # rows left where the run does not know its size (a Dask, Spark or Ray job's workers)
BUCKET = 10.0  # seconds a bar of the monitor's chart counts (``KeyView.history``)
SOURCES = ("configured", "stated", "remembered", "found", "followed", "capped")


def source_word(text: str | None) -> str | None:
    """The vocabulary's word (``pacing/auto/sources.py``) for where a limit came from, as a run tells it:
    the word itself, or from a run of an earlier version its text (``remembered (found 2026-11-25
    14:02)``, ``the cap (auto:600)``): its first word, or the word a longer text stands for."""
    if not text:
        return None
    lowered = text.strip().lower()
    if lowered in KINDS:
        return lowered
    if lowered.startswith("the cap"):
        return "capped"
    word = lowered.split(None, 1)[0].strip("(),:")
    return word or None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _whole(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None else 0


@dataclass(frozen=True)
class RunView:
    """One run on the key: every process of it (a job's workers share its ``run_id``) as one."""

    run_id: str
    host: str
    pid: int | None  # None: several processes (``processes``)
    processes: int
    door: str | None
    output: str | None
    rpm: float | None
    limit_source: str | None
    share: float
    sent: int
    reused: int
    rate_limited: int
    rows_left: int | str | None  # UNKNOWN when a process of it does not know its size; None: it has no rows (a gateway)
    rate_1m: int
    eta_s: float | None
    started_at: float | None
    pace: float | None = None
    waiting: str | None = None  # every key's quota spent: what it waits for (``waits for the ...``)
    queue: int | None = None  # a gateway: requests waiting for their turn now (None: a run of rows)
    wait_p50_s: float | None = None  # a gateway: its requests' wait for their turn in the trailing minute
    wait_p95_s: float | None = None

    @classmethod
    def of(cls, entries: Sequence[RunEntry]) -> RunView:
        """The run that ``entries`` (the same run id, one per process) are."""
        data = [entry.data for entry in entries]
        first = data[0]
        hosts = sorted({str(d.get("host") or "?") for d in data})
        lefts = [d.get("rows_left") for d in data]
        known = all(isinstance(left, int) and not isinstance(left, bool) for left in lefts)
        etas = [eta for d in data if (eta := _number(d.get("eta_s"))) is not None]
        starts = [started for d in data if (started := _number(d.get("started_at"))) is not None]
        pid = first.get("pid") if len(data) == 1 and isinstance(first.get("pid"), int) else None
        queues = [queue for d in data if isinstance(queue := d.get("queue"), int) and not isinstance(queue, bool)]
        return cls(
            run_id=entries[0].run_id,
            host=", ".join(hosts),
            pid=pid,
            processes=len(data),
            door=str(first["door"]) if first.get("door") else None,
            output=str(first["output"]) if first.get("output") else None,
            rpm=_number(first.get("rpm")),
            limit_source=source_word(first.get("source")),
            share=entries[0].share,
            sent=sum(_whole(d.get("sent")) for d in data),
            reused=sum(_whole(d.get("reused")) for d in data),
            rate_limited=sum(_whole(d.get("rate_limited")) for d in data),
            rows_left=None
            if queues
            else sum(int(left) for left in lefts if isinstance(left, int))
            if known
            else UNKNOWN,
            rate_1m=sum(_whole(d.get("rate_1m")) for d in data),
            eta_s=max(etas) if known and etas and len(etas) == len(data) else None,
            started_at=min(starts) if starts else None,
            pace=_number(first.get("pace")),
            waiting=next((str(d["waiting"]) for d in data if isinstance(d.get("waiting"), str)), None),
            queue=sum(queues) if queues else None,
            wait_p50_s=max((w for d in data if (w := _number(d.get("wait_p50_s"))) is not None), default=None),
            wait_p95_s=max((w for d in data if (w := _number(d.get("wait_p95_s"))) is not None), default=None),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "host": self.host,
            "pid": self.pid,
            "processes": self.processes,
            "door": self.door,
            "output": self.output,
            "rpm": self.rpm,
            "limit_source": self.limit_source,
            "share": self.share,
            "sent": self.sent,
            "reused": self.reused,
            "rate_limited": self.rate_limited,
            "rows_left": self.rows_left,
            "rate_1m": self.rate_1m,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "started_at": self.started_at,
            "waiting": self.waiting,
            "queue": self.queue,
            "wait_p50_s": self.wait_p50_s,
            "wait_p95_s": self.wait_p95_s,
        }


@dataclass(frozen=True)
class LimitView:
    """A limit some runs on the key pace by, and where it came from."""

    limit: float
    source: str | None
    runs: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "limit_source": self.source, "runs": list(self.runs)}


@dataclass(frozen=True)
class QuotaView:
    """A quota of the key longer than a minute: configured by its runs (counted on the budget) or
    stated by the service (its last statement); what is left and when it resets (Unix time)."""

    name: str
    source: str  # configured, stated
    limit: int | None
    used: int | None
    left: int | None
    reset_at: float | None
    spent: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "limit": self.limit,
            "used": self.used,
            "left": self.left,
            "reset_at": self.reset_at,
            "spent": self.spent,
        }


@dataclass(frozen=True)
class KeyView:
    """One key on the budget now (never the key: its short hash), with ``label`` as the caller names
    it (``--keys FILE``'s line). ``limit`` is the lowest of ``limits`` when its runs disagree
    (``limit_source`` then ``disagree``). ``history``: starts and 429s per ``BUCKET`` seconds of the
    ledger read, as (bucket start, starts, 429s), on the budget's clock (``now``, Unix time)."""

    key: str
    service: str
    now: float
    limit: float | None
    limit_source: str | None
    limits: tuple[LimitView, ...]
    rate_1m: int
    starts_10s: int
    rate_limited_1m: int
    paused_until: float | None
    pause_reason: str | None
    pace: float | None
    quotas: tuple[QuotaView, ...]
    counted: dict[str, int]  # requests counted on the key's quotas in the hour, day and month now
    search: dict[str, Any] | None
    runs: tuple[RunView, ...]
    history: tuple[tuple[float, int, int], ...] = ()
    label: str | None = None

    @property
    def disagree(self) -> bool:
        return len(self.limits) > 1

    def as_json(self) -> dict[str, Any]:
        """The key as ``batchsum top --json`` gives it (``docs/top.schema.json``)."""
        return {
            "key": self.key,
            "label": self.label,
            "service": self.service,
            "limit": self.limit,
            "limit_source": self.limit_source,
            "limits": [limit.as_json() for limit in self.limits],
            "rate_1m": self.rate_1m,
            "starts_10s": self.starts_10s,
            "rate_limited_1m": self.rate_limited_1m,
            "paused_until": self.paused_until,
            "pause_reason": self.pause_reason,
            "pace": self.pace,
            "quotas": [quota.as_json() for quota in self.quotas],
            "counted": dict(self.counted),
            "search": self.search,
            "runs": [run.as_json() for run in self.runs],
        }


def _remembered(state: KeyState, name: str) -> Any:
    return next((entry for entry in state.remembered if entry.name == name), None)


def _limits(state: KeyState, runs: Sequence[RunView]) -> tuple[tuple[LimitView, ...], float | None, str | None]:
    """The limits the runs pace by (each once, with its runs, and the source that says most of it: a
    run that found or was told it before one that followed it); the key's limit and its source."""
    held: dict[float, list[RunView]] = {}
    for run in runs:
        if run.rpm:
            held.setdefault(run.rpm, []).append(run)
    limits = tuple(
        LimitView(rpm, min((run.limit_source for run in pacing), key=_telling), tuple(run.run_id for run in pacing))
        for rpm, pacing in sorted(held.items())
    )
    if len(limits) == 1:
        return limits, limits[0].limit, limits[0].source
    if limits:
        return limits, min(limit.limit for limit in limits), "disagree"
    entry = _remembered(state, LIMIT)
    found = Found.from_json(entry.value, entry.at) if entry is not None else None
    return (), (found.rpm if found is not None else None), ("remembered" if found is not None else None)


def _telling(source: str | None) -> int:
    """How much a source says of where a limit came from (less: more): its own before another's."""
    order = ("configured", "stated", "found", "capped", "remembered", "followed", "searching")
    return order.index(source) if source in order else len(order)


def _quotas(state: KeyState, runs: Sequence[RunEntry]) -> tuple[QuotaView, ...]:
    """The configured quotas of the runs on the key (counted here), the service's stated one, and
    a quota known spent."""
    out: list[QuotaView] = []
    configured = set()
    for entry in runs:
        try:
            quota = parse_quota(entry.data.get("quota")) if entry.data.get("quota") else None
        except InvalidParameterError:
            quota = None
        if quota is not None:
            configured.add(quota)
    for quota in sorted(configured, key=str):
        used = state.paid.get(quota.period, 0)
        left = max(0, quota.limit - used)
        end = period_window(quota.period, state.now)[2]
        out.append(QuotaView(quota.name, "configured", quota.limit, used, left, end, spent=left == 0))
    stated = _remembered(state, QUOTA)
    try:
        data = json.loads(stated.value) if stated is not None else None
    except ValueError:
        data = None
    if isinstance(data, dict) and (_number(data.get("reset_at")) or 0.0) > state.now:
        stated_limit = data.get("limit") if isinstance(data.get("limit"), int) else None
        remaining = data.get("remaining") if isinstance(data.get("remaining"), int) else None
        name = f"{window_name(_number(data.get('window')))} quota" + (f" of {stated_limit}" if stated_limit else "")
        reset = _number(data["reset_at"])
        out.append(QuotaView(name, "stated", stated_limit, None, remaining, reset, spent=remaining == 0))
    spent_entry = _remembered(state, QUOTA_SPENT)
    spent = Spent.from_json(spent_entry.value) if spent_entry is not None else None
    if spent is not None and spent.until > state.now and not any(q.spent for q in out):
        source = "configured" if "(configured)" in spent.name else "stated"
        out.append(QuotaView(spent.name, source, None, None, 0, spent.until, spent=True))
    return tuple(out)


def _search(state: KeyState) -> dict[str, Any] | None:
    """The search for the key's limit under way (``--rpm auto``): its phase and the level it tries."""
    if state.lead_state is None or state.lead_until <= state.now:
        return None
    try:
        data = json.loads(state.lead_state)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    search = data.get("search")
    if isinstance(search, dict):
        level = _number(search.get("level"))
        return {"phase": str(search.get("phase") or "search"), "level": level, "cap": _number(data.get("cap"))}
    if data.get("standing") == "probe":
        return {"phase": "probe", "level": _number(data.get("probe_level")), "cap": _number(data.get("cap"))}
    return None


def _history(state: KeyState) -> tuple[tuple[float, int, int], ...]:
    ledger = state.ledger
    buckets: dict[float, list[int]] = {}
    per = round(BUCKET / TICK)
    for at, (starts, refused) in enumerate(zip(ledger.starts, ledger.refused)):
        if starts or refused:
            tick = ledger.first + at
            bucket = buckets.setdefault((tick // per) * BUCKET, [0, 0])
            bucket[0] += starts
            bucket[1] += refused
    return tuple((start, counts[0], counts[1]) for start, counts in sorted(buckets.items()))


def key_view(state: KeyState, label: str | None = None) -> KeyView:
    """The key ``state`` holds, as it is shown."""
    by_run: dict[str, list[RunEntry]] = {}
    for entry in state.runs:
        by_run.setdefault(entry.run_id, []).append(entry)
    runs = tuple(
        sorted((RunView.of(entries) for entries in by_run.values()), key=lambda r: (r.started_at or 0.0, r.run_id))
    )
    limits, limit, source = _limits(state, runs)
    now, ledger = state.now, state.ledger
    return KeyView(
        key=state.key_hash,
        service=state.service,
        now=now,
        limit=limit,
        limit_source=source,
        limits=limits,
        rate_1m=ledger.started(now - 60.0, now + TICK),
        starts_10s=ledger.started(now - 10.0, now + TICK),
        rate_limited_1m=ledger.refusals(now - 60.0, now + TICK),
        paused_until=state.paused_until if state.paused_until > now else None,
        pause_reason=state.pause_reason if state.paused_until > now else None,
        pace=state.pace,
        quotas=_quotas(state, state.runs),
        counted=dict(state.paid),
        search=_search(state),
        runs=runs,
        history=_history(state),
        label=label,
    )


def _active(state: KeyState) -> bool:
    """Something is happening on the key: a run on it, a start or 429 in the ledger read, a pause, a search."""
    ledger = state.ledger
    return bool(
        state.runs
        or any(ledger.starts)
        or any(ledger.refused)
        or any(ledger.answered)
        or state.paused_until > state.now
        or (state.lead_state is not None and state.lead_until > state.now)
    )


@dataclass(frozen=True)
class BudgetView:
    """The keys active on a budget (``where``, redacted), read at once."""

    where: str
    keys: tuple[KeyView, ...] = field(default_factory=tuple)

    def as_json(self) -> dict[str, Any]:
        return {"budget": self.where, "keys": [key.as_json() for key in self.keys]}


async def read_view(
    where: Location | str,
    display: str,
    *,
    seconds: float = 70.0,
    labels: dict[str, str] | None = None,
    every: bool = False,
) -> BudgetView:
    """The keys active on the budget at ``where`` (``sqlite:///PATH`` or ``redis://...``), shown as
    ``display``; ``labels``: key hash -> its label; ``every``: the idle keys too; ``seconds``: the
    ledger read (70 s: the last minute's figures; more for a chart's history)."""
    states = await read_states(where, max(61.0, seconds))
    labels = labels or {}
    keys = tuple(key_view(state, labels.get(state.key_hash)) for state in states if every or _active(state))
    return BudgetView(display, keys)
