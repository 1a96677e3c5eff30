"""What a person or a scheduler sees of a run: its live counts (``BatchStats``), its one-line
account, its timeline second by second (``Timeline``), as plain data that travels with a result
(``out.attrs["batchsum"]``) and that the chart (``app/chart.py``) draws; and the run report
(``run_report``: the JSON a scheduler reads, schema ``docs/run-report.schema.json``; ``merge_reports``
for the partitions of a Dask job; ``describe_report`` for a person)."""

from __future__ import annotations

import datetime
import math
import operator
import platform
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..data.results import OK, SKIPPED, RowResult

_STATUS = operator.attrgetter("status")

if TYPE_CHECKING:
    from ..pacing import Pacer, PacerState
    from .telemetry import Metrics

__all__ = ["BatchStats", "LongWork", "Timeline", "run_report", "merge_reports", "describe_report", "REPORT_SCHEMA"]

REPORT_SCHEMA = "batchsum-run-report/1"  # bumped only by a change that breaks a reader


class Timeline:
    """What a run did, second by second: attempts started, 429s, rows done; the pace in force and
    the pauses, with why. One entry per second of the run (a day is 86,400), not per request, so
    it can travel with a result (``out.attrs["batchsum"]``) and be drawn (``batchsum.plot_run``)."""

    __slots__ = ("rpm", "_origin", "_wall", "_seconds", "_in_flight", "pace", "pauses")

    def __init__(self, rpm: float) -> None:
        self.rpm = rpm
        self._origin: float | None = None  # the clock at the first event
        self._wall = 0.0
        self._seconds: dict[int, list[int]] = {}  # second -> [started, refused, done]
        self._in_flight: dict[int, int] = {}  # second -> the most attempts on the wire in it
        self.pace: list[tuple[float, float]] = []  # (seconds since the start, pace from then on)
        self.pauses: list[tuple[float, float, str]] = []  # (from, until, why), seconds since the start

    def _since(self, now: float) -> float:
        if self._origin is None:
            self._origin, self._wall = now, time.time()
            self.pace.append((0.0, self.rpm))
        return max(0.0, now - self._origin)

    def _count(self, now: float, which: int) -> None:
        self._seconds.setdefault(int(self._since(now)), [0, 0, 0])[which] += 1

    def started(self, now: float) -> None:
        self._count(now, 0)

    def refused(self, now: float) -> None:
        self._count(now, 1)

    def done(self, now: float, count: int = 1) -> None:
        self._seconds.setdefault(int(self._since(now)), [0, 0, 0])[2] += count

    def in_flight(self, now: float, count: int) -> None:
        second = int(self._since(now))
        if count > self._in_flight.get(second, -1):
            self._in_flight[second] = count

    def pace_changed(self, now: float, pace: float) -> None:
        self.pace.append((self._since(now), pace))

    def paused(self, now: float, until: float, why: str) -> None:
        start, end = self._since(now), self._since(now) + (until - now)
        if self.pauses and self.pauses[-1][1] >= start:  # the same pause, made longer
            start, why = self.pauses[-1][0], self.pauses[-1][2]
            self.pauses.pop()
        self.pauses.append((start, end, why))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (JSON-able): ``seconds`` rows are [second, started, refused, done];
        ``in_flight`` rows [second, the most attempts on the wire in it]."""
        return {
            "rpm": self.rpm,
            "started_at": self._wall or None,
            "seconds": [[second, *counts] for second, counts in sorted(self._seconds.items())],
            "in_flight": [[second, count] for second, count in sorted(self._in_flight.items())],
            "pace": [list(change) for change in self.pace],
            "pauses": [list(pause) for pause in self.pauses],
        }


@dataclass
class LongWork:
    """Long texts' extra requests: planned and done (the bar counts them), and what the skipped ones
    would cost split."""

    planned: int = 0
    done: int = 0
    skipped_parts: int = 0
    skipped_reduce: int = 0


@dataclass
class BatchStats:
    """Live counts of a batch, read by progress bars and the final account."""

    total: int | None = None
    done: int = 0  # rows whose result is known (counted as they arrive, in any order)
    yielded: int = 0  # rows handed out, in input order (what an output holds so far)
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    sent: int = 0  # requests that went to the service (each may take several attempts)
    attempts: int = 0
    reused: int = 0  # rows answered from the store or by an identical request of this run
    skipped_by_reason: Counter[str] = field(default_factory=Counter)
    failed_by_code: Counter[str] = field(default_factory=Counter)
    sent_by_kind: Counter[str] = field(default_factory=Counter)  # "row", "part", "reduce"
    long_work: LongWork = field(default_factory=lambda: LongWork())
    started: float = field(default_factory=time.monotonic)
    pacer: Pacer | None = None
    timeline: Timeline | None = None  # told by the pacer (``PaceLog``) and by the counts here
    first_request: str | None = None  # whether the run's first request went alone, and why
    requests: int = 0  # attempts that went to the service, 429s and retries included
    outcomes: Counter[str] = field(default_factory=Counter)  # attempts by outcome: ok, rate_limited, error codes
    latencies: array[float] = field(default_factory=lambda: array("d"))  # of answered attempts, seconds
    telemetry: Metrics | None = None

    @property
    def paid(self) -> int:
        """Attempts the service charges for: every attempt but its 429s (the service's "later")."""
        return self.requests - self.outcomes["rate_limited"]

    def attempt_started(self, on_wire: int) -> None:
        self.requests += 1
        if self.pacer is not None and self.timeline is not None:
            self.timeline.in_flight(self.pacer.now(), on_wire)
        if self.telemetry is not None:
            self.telemetry.attempt_started()

    def attempt_ended(self, outcome: str, latency: float | None, on_wire: int) -> None:
        self.outcomes[outcome] += 1
        if latency is not None:
            self.latencies.append(latency)
        if self.pacer is not None and self.timeline is not None:
            self.timeline.in_flight(self.pacer.now(), on_wire)
        if self.telemetry is not None:
            self.telemetry.attempt_ended(outcome, latency)

    @property
    def work_total(self) -> int | None:
        """What the bar counts to: one per row, and a long row's extra requests (planned: its parts
        and one reduce; corrected when it is done)."""
        return None if self.total is None else self.total + self.long_work.planned

    @property
    def work_done(self) -> int:
        return self.done + self.long_work.done

    def long_skipped(self, words: int) -> None:
        """A text over the limit skipped (``long_texts="skip"``): what splitting it would cost."""
        from ..engine.long_texts import estimate_requests

        parts, reduce = estimate_requests(words)
        self.long_work.skipped_parts += parts
        self.long_work.skipped_reduce += reduce

    def long_planned(self, parts: int) -> None:
        self.long_work.planned += parts  # parts + one reduce, less the row itself

    def long_done(self, result: RowResult, parts: int, answers: Sequence[object]) -> RowResult:
        """A long row finished with ``result`` after ``answers`` (its requests): the plan corrected."""
        extra = len(answers) - 1 if result.status == OK else len(answers)
        self.long_work.planned += extra - parts
        self.long_work.done += extra
        return result._replace(requests=len(answers))

    @property
    def rate_limited(self) -> int:
        return self.pacer.rate_limited if self.pacer else 0

    @property
    def pace(self) -> float:
        return self.pacer.pace if self.pacer else 0.0

    def pacer_state(self) -> PacerState | None:
        """The pacer's state now (pace, pause and why, in flight), for progress lines."""
        try:
            return self.pacer.state() if self.pacer else None
        except RuntimeError:  # no running loop (read from another thread after the run)
            return None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def record(self) -> dict[str, Any]:
        """The run's account and timeline as plain data (``out.attrs["batchsum"]``, ``plot_run``)."""
        timeline = self.timeline.to_dict() if self.timeline is not None else None
        if timeline is not None:
            timeline["total"] = self.total
        return {
            "account": self.account(),
            "rows": self.done,
            "ok": self.ok,
            "skipped": self.skipped,
            "failed": self.failed,
            "sent": self.sent,
            "sent_by_kind": dict(self.sent_by_kind),
            "reused": self.reused,
            "rate_limited": self.rate_limited,
            "skipped_by_reason": dict(self.skipped_by_reason),
            "failed_by_code": dict(self.failed_by_code),
            "seconds": round(self.elapsed, 3),
            "pace_changes": [str(change) for change in self.pacer.changes] if self.pacer is not None else [],
            "timeline": timeline,
        }

    def count(self, result: RowResult) -> None:
        if self.pacer is not None and self.timeline is not None:
            self.timeline.done(self.pacer.now())
        self.done += 1
        if self.telemetry is not None:
            self.telemetry.row_done(result.status)
        if result.status == OK:
            self.ok += 1
        elif result.status == SKIPPED:
            self.skipped += 1
            self.skipped_by_reason[result.error or "?"] += 1
        else:
            self.failed += 1
            self.failed_by_code[result.error or "?"] += 1

    def count_many(self, results: Sequence[RowResult]) -> None:
        """``count`` for rows whose results came together (a block the store answered)."""
        if self.pacer is not None and self.timeline is not None:
            self.timeline.done(self.pacer.now(), len(results))
        self.done += len(results)
        statuses = list(map(_STATUS, results))
        ok = statuses.count(OK)
        for result in results if ok < len(results) else ():
            if result.status == OK:
                continue
            if result.status == SKIPPED:
                self.skipped += 1
                self.skipped_by_reason[result.error or "?"] += 1
                if self.telemetry is not None:
                    self.telemetry.row_done(SKIPPED)
            else:
                self.failed += 1
                self.failed_by_code[result.error or "?"] += 1
                if self.telemetry is not None:
                    self.telemetry.row_done(result.status)
        self.ok += ok
        if ok and self.telemetry is not None:
            self.telemetry.row_done(OK, ok)

    def account(self) -> str:
        """One line: rows, sent, reused, skipped by reason, failed by code, 429s, wall time."""

        def by(counter: Counter[str]) -> str:
            return " (" + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) + ")" if counter else ""

        parts, reduces = self.sent_by_kind["part"], self.sent_by_kind["reduce"]
        long = f" ({parts} long-text parts, {reduces} reduces)" if parts or reduces else ""
        line = (
            f"{self.done} rows: {self.ok} ok, {self.skipped} skipped{by(self.skipped_by_reason)}, "
            f"{self.failed} failed{by(self.failed_by_code)}; {self.sent} sent{long}, {self.reused} reused, "
            f"{self.rate_limited} 429s, {self.elapsed:.1f}s"
        )
        work = self.long_work
        if work.skipped_parts:
            line += (
                f". The {self.skipped_by_reason['too_long']} too_long rows would take {work.skipped_parts} "
                f"part requests and at most {work.skipped_reduce} reduce requests with --long-texts split (long_texts='split')"
            )
        return line


def _iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _percentile(ordered: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def _latency(values: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(ordered),
        "p50": round(_percentile(ordered, 0.5), 6),
        "p90": round(_percentile(ordered, 0.9), 6),
        "p99": round(_percentile(ordered, 0.99), 6),
        "max": round(ordered[-1], 6),
    }


def _versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for package in ("batchsum", "httpx"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def run_report(
    stats: BatchStats,
    *,
    run_id: str,
    options: dict[str, Any],
    started_at: float,
    ended_at: float,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """The run report as plain data (JSON-able), schema ``docs/run-report.schema.json``.

    ``started_at`` / ``ended_at``: wall-clock times. ``error``: what ended the run, if not its end:
    a stop (a signal, the request cap, a refused key, a broken input, a journal: ``stopped``) or
    anything else (``failed``)."""
    from ..service.errors import BatchsumError

    if error is None:
        outcome = "finished"
    elif isinstance(error, (BatchsumError, KeyboardInterrupt)) or type(error).__name__ == "CancelledError":
        outcome = "stopped"
    else:
        outcome = "failed"
    timeline = stats.timeline.to_dict() if stats.timeline is not None else None
    if timeline is not None:
        timeline["total"] = stats.total
    auto = stats.pacer.auto if stats.pacer is not None else None
    rpm = auto.limit() if auto is not None else float(options.get("rpm") or 0.0)  # under auto: the limit in force
    share = float(options.get("share") or 1.0)
    minutes = max(ended_at - started_at, 1e-9) / 60
    per_minute = stats.paid / minutes
    rate_limited = stats.outcomes["rate_limited"]
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "versions": _versions(),
        "options": options,
        "started_at": _iso(started_at),
        "ended_at": _iso(ended_at),
        "seconds": round(ended_at - started_at, 3),
        "outcome": outcome,
        "error": None if error is None else {"type": type(error).__name__, "message": _stop_message(error)},
        "rows": {
            "total": stats.total,
            "done": stats.done,
            "ok": stats.ok,
            "skipped": stats.skipped,
            "failed": stats.failed,
            "skipped_by_reason": dict(sorted(stats.skipped_by_reason.items())),
            "failed_by_code": dict(sorted(stats.failed_by_code.items())),
        },
        "requests": {
            "sent": stats.requests,
            "paid": stats.paid,
            "rate_limited": rate_limited,
            "retried": max(0, stats.paid - stats.sent),
            "texts_sent": stats.sent,
            "reused": stats.reused,
            "skipped": stats.skipped,
            "by_outcome": dict(sorted(stats.outcomes.items())),
            "max_requests": options.get("max_requests"),
        },
        "pauses": [
            {"from": round(start, 3), "until": round(until, 3), "why": why}
            for start, until, why in (timeline or {}).get("pauses", [])
        ],
        "utilization": {
            "plan_rpm": rpm,
            "share": share,
            "paid_per_minute": round(per_minute, 3),
            "of_plan": round(per_minute / rpm, 4) if rpm else None,
            "of_share": round(per_minute / (rpm * share), 4) if rpm else None,
        },
        "latency": _latency(stats.latencies),
        "pace": _pace(stats),
        "timeline": timeline,
    }


def _stop_message(error: BaseException) -> str:
    """What ended a run, in one line: a signal or a cancel says so (not ``CancelledError()``)."""
    if isinstance(error, KeyboardInterrupt) or type(error).__name__ == "CancelledError":
        return "stopped by a signal (Ctrl-C, SIGTERM) or a cancel; answers on the wire were awaited and kept"
    from ..service.errors import one_line

    return one_line(str(error) or repr(error))


def _pace(stats: BatchStats) -> dict[str, Any]:
    """The report's pace section: the first request, the changes, and under auto the limit in force
    (where it came from, and the 429s its upward probes cost)."""
    pacer = stats.pacer
    auto = pacer.auto if pacer is not None else None
    configured = pacer is not None and auto is None and bool(pacer.rpm)
    return {
        "first_request": stats.first_request,
        "changes": [str(change) for change in pacer.changes] if pacer is not None else [],
        "limit": auto.value if auto is not None else pacer.rpm if configured and pacer is not None else None,
        "limit_source": auto.source if auto is not None else "configured" if configured else None,
        "probe_rate_limited": 0 if auto is None else auto.probe_refused,
    }


_SUMMED = {
    "rows": ("total", "done", "ok", "skipped", "failed"),
    "requests": ("sent", "paid", "rate_limited", "retried", "texts_sent", "reused", "skipped"),
}


def merge_reports(reports: Sequence[dict[str, Any]], *, run_id: str) -> dict[str, Any]:
    """One report for the partitions of a job (Dask): counts summed, the earliest start and latest
    end, the worst outcome, latency percentiles the largest of the partitions' (an upper bound);
    timelines stay in the partitions' own files (``partitions`` says how many)."""
    if not reports:
        raise ValueError("no reports to merge")
    merged: dict[str, Any] = {key: value for key, value in reports[0].items() if key != "timeline"}
    merged["run_id"] = run_id
    merged["started_at"] = min(r["started_at"] for r in reports)
    merged["ended_at"] = max(r["ended_at"] for r in reports)
    start = datetime.datetime.fromisoformat(merged["started_at"])
    end = datetime.datetime.fromisoformat(merged["ended_at"])
    merged["seconds"] = round((end - start).total_seconds(), 3)
    order = ("finished", "stopped", "failed")
    merged["outcome"] = max((r["outcome"] for r in reports), key=order.index)
    merged["error"] = next((r["error"] for r in reports if r["error"] is not None), None)
    for section, names in _SUMMED.items():
        merged[section] = dict(reports[0][section])
        for name in names:
            values = [r[section][name] for r in reports]
            merged[section][name] = None if any(v is None for v in values) else sum(values)
        for name in ("skipped_by_reason", "failed_by_code", "by_outcome"):
            if name in merged[section]:
                total: Counter[str] = Counter()
                for r in reports:
                    total.update(r[section][name])
                merged[section][name] = dict(sorted(total.items()))
    merged["pauses"] = [pause for r in reports for pause in r["pauses"]]
    rpm = merged["utilization"]["plan_rpm"]
    per_minute = merged["requests"]["paid"] / max(merged["seconds"], 1e-9) * 60
    merged["utilization"] = {
        **merged["utilization"],
        "paid_per_minute": round(per_minute, 3),
        "of_plan": round(per_minute / rpm, 4) if rpm else None,
        "of_share": round(per_minute / (rpm * merged["utilization"]["share"]), 4) if rpm else None,
    }
    # Percentiles do not add up: the merged one is the largest of the partitions' (an upper bound).
    merged["latency"] = {"count": sum(r["latency"]["count"] for r in reports)} | {
        name: max((r["latency"][name] for r in reports if r["latency"][name] is not None), default=None)
        for name in ("p50", "p90", "p99", "max")
    }
    paces = [r.get("pace") or {} for r in reports]
    merged["pace"] = {
        "first_request": next((p["first_request"] for p in paces if p.get("first_request")), None),
        "changes": list(dict.fromkeys(change for p in paces for change in p.get("changes", []))),
        "limit": min((p["limit"] for p in paces if p.get("limit") is not None), default=None),
        "limit_source": next((p["limit_source"] for p in paces if p.get("limit_source")), None),
        "probe_rate_limited": sum(p.get("probe_rate_limited", 0) for p in paces),
    }
    merged["timeline"] = None
    merged["partitions"] = len(reports)
    return merged


def describe_report(report: dict[str, Any]) -> str:
    """The report for a person (``batchsum report run.json``)."""
    rows, requests, latency = report["rows"], report["requests"], report["latency"]
    utilization = report["utilization"]

    def by(counts: dict[str, int]) -> str:
        return " (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")" if counts else ""

    error = report.get("error")
    outcome = report["outcome"] + (f": {error['message']}" if error else "")
    cap = requests.get("max_requests")
    if latency["count"]:
        latencies = (
            f"p50 {latency['p50']:.3f}s, p90 {latency['p90']:.3f}s, p99 {latency['p99']:.3f}s, "
            f"max {latency['max']:.3f}s ({latency['count']} answers)"
        )
    else:
        latencies = "none measured"
    use = (
        f"{utilization['paid_per_minute']:g} paid/min = {100 * utilization['of_plan']:.0f}% of the plan's "
        f"{utilization['plan_rpm']:g}/min (share {utilization['share']:g})"
        if utilization["of_plan"] is not None
        else f"{utilization['paid_per_minute']:g} paid/min, unpaced"
    )
    total = rows["total"] if rows["total"] is not None else "?"
    lines = [
        f"run:          {report['run_id']} ({report.get('partitions', 1)} part{'s' if report.get('partitions', 1) != 1 else ''})",
        f"outcome:      {outcome}",
        f"when:         {report['started_at']} to {report['ended_at']} ({report['seconds']:g} s)",
        f"rows:         {rows['done']} of {total}: {rows['ok']} ok, {rows['skipped']} skipped"
        f"{by(rows['skipped_by_reason'])}, {rows['failed']} failed{by(rows['failed_by_code'])}",
        f"requests:     {requests['sent']} sent, {requests['paid']} paid"
        + (f" (cap {cap})" if cap is not None else "")
        + f", {requests['rate_limited']} 429s, {requests['retried']} retries; {requests['reused']} rows reused",
        f"pauses:       {len(report['pauses'])}",
        f"utilization:  {use}",
        f"latency:      {latencies}",
        "versions:     " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
    ]
    return "\n".join(lines)
