"""What a person or a scheduler sees of a run: the run report (``run_report``: the JSON a scheduler
reads, schema ``docs/run-report.schema.json``; ``write_report`` to a file; ``merge_reports`` for the
partitions of a Dask job; ``describe_report`` for a person). The live counts (``BatchStats``) and
the timeline second by second (``Timeline``) it is made of are the engine's (``engine/tally.py``,
``engine/timeline.py``), named here too."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import os
import platform
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..engine.tally import BatchStats as BatchStats
from ..engine.tally import LongWork as LongWork
from ..engine.timeline import Timeline as Timeline
from ..service.errors import (
    AuthenticationError,
    BudgetError,
    InputError,
    JobStopped,
    JournalError,
    NotPremiumError,
    OutputError,
    QuotaSpent,
    RequestCapReached,
    RunCancelled,
    RunInterrupted,
)
from .background import INTERRUPTED

__all__ = [
    "BatchStats",
    "LongWork",
    "Timeline",
    "run_report",
    "merge_reports",
    "describe_report",
    "write_report",
    "stop_cause",
    "upgrade_report",
    "REPORT_SCHEMA",
    "STOP_CAUSES",
]

# Bumped only by a change that breaks a reader (2: several keys; 3: a stop's ``cause``, ``paid`` what
# was billed beside ``used_rate``; 4: the ``door``, a gateway's ``gateway``). Reports of the schemas
# before are still read (merged, described).
REPORT_SCHEMA = "batchsum-run-report/4"

# Why a stopped run stopped (the report's ``cause``), by the type of the error that stopped it: the
# nearest class of the error's own (its MRO) named here. A new kind of stop is one line here (and its
# word in the schema's ``cause``); an error none of these names ended the run as ``failed``.
STOP_CAUSES: dict[type[BaseException], str] = {
    KeyboardInterrupt: "signal",
    asyncio.CancelledError: "cancel",
    RunCancelled: "cancel",
    RunInterrupted: "signal",
    JobStopped: "job_stop",
    RequestCapReached: "request_cap",
    QuotaSpent: "quota",
    AuthenticationError: "key_refused",
    NotPremiumError: "key_refused",
    BudgetError: "budget_unreachable",
    JournalError: "journal",
    InputError: "input",
    OutputError: "output",
}


def stop_cause(error: BaseException | None) -> str | None:
    """The ``cause`` of a run that ``error`` stopped (``STOP_CAUSES``); None: not a stop (no error, or
    a failure)."""
    if error is None:
        return None
    if isinstance(error, asyncio.CancelledError) and INTERRUPTED in error.args:
        return "signal"  # a worker's run cancelled because its caller was interrupted (``run_in_worker``)
    return next((STOP_CAUSES[kind] for kind in type(error).__mro__ if kind in STOP_CAUSES), None)


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
    keys: Sequence[dict[str, Any]] = (),
    door: str | None = None,
) -> dict[str, Any]:
    """The run report as plain data (JSON-able), schema ``docs/run-report.schema.json``.
    ``keys``: each key of the run as ``engine.lanes.KeyLane.describe`` gives it (its hash, never the key).
    ``door``: the front-end the run went through.

    ``started_at`` / ``ended_at``: wall-clock times. ``error``: what ended the run, if not its end:
    a stop (``stopped``, its ``cause`` by ``STOP_CAUSES``: a signal, the request cap, a refused key, a
    broken input, a journal, ...) or anything else (``failed``)."""
    cause = stop_cause(error)
    outcome = "finished" if error is None else "stopped" if cause is not None else "failed"
    timeline = stats.timeline.to_dict() if stats.timeline is not None else None
    if timeline is not None:
        timeline["total"] = stats.total
    auto = stats.pacer.auto if stats.pacer is not None else None
    rpm = auto.limit() if auto is not None else float(options.get("rpm") or 0.0)  # under auto: the limit in force
    if len(keys) > 1:  # several keys: the plan is the sum of their limits
        rpm = float(sum(key["limit"] or 0.0 for key in keys))
    share = float(options.get("share") or 1.0)
    rate_limited = stats.outcomes["rate_limited"]
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "door": door,
        "versions": _versions(),
        "options": options,
        "started_at": _iso(started_at),
        "ended_at": _iso(ended_at),
        "seconds": round(ended_at - started_at, 3),
        "outcome": outcome,
        "cause": cause,
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
            "used_rate": stats.used_rate,
            "rate_limited": rate_limited,
            "retried": max(0, stats.requests - rate_limited - stats.sent),
            "texts_sent": stats.sent,
            "reused": stats.reused,
            "from_store": stats.from_store,
            "skipped": stats.skipped,
            "by_outcome": dict(sorted(stats.outcomes.items())),
            "max_requests": options.get("max_requests"),
        },
        "pauses": [
            {"from": round(start, 3), "until": round(until, 3), "why": why}
            for start, until, why in (timeline or {}).get("pauses", [])
        ],
        "utilization": _utilization(rpm, share, stats.paid, stats.used_rate, ended_at - started_at),
        "latency": _latency(stats.latencies),
        "gateway": _gateway(stats),
        "pace": _pace(stats),
        "keys": list(keys),
        "timeline": timeline,
    }


def _gateway(stats: BatchStats) -> dict[str, Any] | None:
    """A gateway's requests: answered, late (429 at their deadline), unavailable (503), their waits."""
    waits = stats.waits
    if waits is None:
        return None
    wait = _latency(waits.every)
    wait.pop("count")
    return {
        "answered": waits.answered,
        "late": waits.late,
        "unavailable": waits.unavailable,
        "wait": {"count": waits.count, **wait},
    }


def _utilization(rpm: float, share: float, paid: int, used_rate: int, seconds: float) -> dict[str, Any]:
    """How much of the plan (and of the run's share of it) the run used: what used the rate a minute,
    beside what was billed a minute."""
    minutes = max(seconds, 1e-9) / 60
    used = used_rate / minutes
    return {
        "plan_rpm": rpm,
        "share": share,
        "paid_per_minute": round(paid / minutes, 3),
        "used_per_minute": round(used, 3),
        "of_plan": round(used / rpm, 4) if rpm else None,
        "of_share": round(used / (rpm * share), 4) if rpm else None,
    }


def _stop_message(error: BaseException) -> str:
    """What ended a run, in one line: a signal or a cancel says so (not ``CancelledError()``)."""
    if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)):
        return "stopped by a signal (Ctrl-C, SIGTERM) or a cancel; answers on the wire were awaited and kept"
    from ..service.errors import one_line

    return one_line(str(error) or repr(error))


def _pace(stats: BatchStats) -> dict[str, Any]:
    """The report's pace section: the first request, the changes, and under auto the limit in force
    (where it came from, and the 429s its upward probes cost)."""
    from ..pacing.auto.sources import Source

    pacer = stats.pacer
    auto = pacer.auto if pacer is not None else None
    configured = pacer is not None and auto is None and bool(pacer.rpm)
    source = auto.source if auto is not None else Source.configured() if configured else None
    return {
        "first_request": stats.first_request,
        "changes": [str(change) for change in pacer.changes] if pacer is not None else [],
        "limit": auto.value if auto is not None else pacer.rpm if configured and pacer is not None else None,
        "limit_source": source.kind if source is not None else None,
        "limit_detail": source.detail() if source is not None else None,
        "probe_rate_limited": 0 if auto is None else auto.probe_refused,
    }


_SUMMED = {
    "rows": ("total", "done", "ok", "skipped", "failed"),
    "requests": (
        "sent", "paid", "used_rate", "rate_limited", "retried", "texts_sent", "reused", "from_store", "skipped",
    ),
}  # fmt: skip
_ORDER = ("finished", "stopped", "failed")


def merge_reports(reports: Sequence[dict[str, Any]], *, run_id: str) -> dict[str, Any]:
    """One report for the partitions of a job (Dask): counts summed, the earliest start and latest
    end, the worst outcome (and the cause of the first part stopped so), latency percentiles the
    largest of the partitions' (an upper bound); timelines stay in the partitions' own files
    (``partitions`` says how many). Parts of schema 2 are read as 3 (``upgrade_report``)."""
    if not reports:
        raise ValueError("no reports to merge")
    reports = [upgrade_report(report) for report in reports]
    merged: dict[str, Any] = {key: value for key, value in reports[0].items() if key != "timeline"}
    merged["schema"] = REPORT_SCHEMA
    merged["run_id"] = run_id
    merged["started_at"] = min(r["started_at"] for r in reports)
    merged["ended_at"] = max(r["ended_at"] for r in reports)
    start = datetime.datetime.fromisoformat(merged["started_at"])
    end = datetime.datetime.fromisoformat(merged["ended_at"])
    merged["seconds"] = round((end - start).total_seconds(), 3)
    worst = max(reports, key=lambda r: _ORDER.index(r["outcome"]))
    merged["outcome"], merged["cause"], merged["error"] = worst["outcome"], worst["cause"], worst["error"]
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
    utilization, requests = merged["utilization"], merged["requests"]
    merged["utilization"] = _utilization(
        utilization["plan_rpm"], utilization["share"], requests["paid"], requests["used_rate"], merged["seconds"]
    )
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
        "limit_detail": next((p["limit_detail"] for p in paces if p.get("limit_detail")), None),
        "probe_rate_limited": sum(p.get("probe_rate_limited", 0) for p in paces),
    }
    merged["gateway"] = _merged_gateway([r["gateway"] for r in reports if r.get("gateway") is not None])
    merged["keys"] = _merged_keys([r.get("keys") or [] for r in reports])
    merged["timeline"] = None
    merged["partitions"] = len(reports)
    return merged


def upgrade_report(report: dict[str, Any]) -> dict[str, Any]:
    """A report as schema 4 reads it: one of schema 3 (or earlier) gets its ``door`` and ``gateway``
    (null: not known, and no gateway); one of schema 2 (or earlier) its ``cause`` (null: not known),
    ``requests.used_rate`` (its ``paid``: what schema 2 counted, every attempt but its 429s) and
    ``utilization.used_per_minute``; its ``paid`` stays as it was counted then. A report of schema 4
    comes back as it is."""
    if report.get("schema") == REPORT_SCHEMA:
        return report
    upgraded = dict(report)
    upgraded.setdefault("door", None)
    upgraded.setdefault("gateway", None)
    upgraded.setdefault("cause", None)
    requests = upgraded["requests"] = dict(report["requests"])
    requests.setdefault("used_rate", requests["paid"])
    utilization = upgraded["utilization"] = dict(report["utilization"])
    utilization.setdefault("used_per_minute", utilization["paid_per_minute"])
    return upgraded


def _merged_gateway(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A gateway's parts (one a key, or a replica's) as one: counts summed, each wait percentile the
    largest of the parts' (an upper bound)."""
    if not parts:
        return None
    waits = [part["wait"] for part in parts]
    return {name: sum(part[name] for part in parts) for name in ("answered", "late", "unavailable")} | {
        "wait": {"count": sum(w["count"] for w in waits)}
        | {
            name: max((w[name] for w in waits if w[name] is not None), default=None)
            for name in ("p50", "p90", "p99", "max")
        }
    }


def _merged_keys(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The partitions' keys, one entry per key: counts summed, the first refusal and quota said."""
    merged: dict[str, dict[str, Any]] = {}
    for keys in parts:
        for key in keys:
            entry = merged.setdefault(key["hash"], dict(key))
            if entry is not key:
                entry["requests"] += key["requests"]
                entry["rate_limited"] += key["rate_limited"]
                for name in ("refusal", "quota", "quota_spent_until"):
                    entry[name] = entry.get(name) or key.get(name)
    return list(merged.values())


def write_report(path: str | os.PathLike[str], report: dict[str, Any], *, shared: bool = False) -> None:
    """Write ``report`` to ``path`` (whole, or not at all: a temporary file renamed). A shared run (a
    Dask partition) writes ``STEM.part-RUN.json`` beside it and then merges every part there into
    ``path`` under a lock, so the merged file is whole after each partition."""
    target = os.fspath(path)
    if not shared:
        _write_json(target, report)
        return
    import fcntl
    import glob

    stem, suffix = os.path.splitext(target)
    part = f"{stem}.part-{uuid.uuid4().hex[:12]}{suffix or '.json'}"
    _write_json(part, report)
    with open(target + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = []
        for name in sorted(glob.glob(glob.escape(stem) + ".part-*" + (suffix or ".json"))):
            try:
                with open(name, encoding="utf-8") as file:
                    one = json.load(file)
            except (OSError, ValueError):
                continue
            if one.get("run_id") == report["run_id"]:
                parts.append(one)
        _write_json(target, merge_reports(parts, run_id=report["run_id"]))


def _write_json(path: str, data: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    with open(temporary, "x", encoding="utf-8") as file:
        json.dump(data, file, indent=2, ensure_ascii=False)
        file.write("\n")
    os.replace(temporary, path)


def _key_line(key: dict[str, Any]) -> str:
    """``3f2a9c1b7d0e (keys.txt line 2): 120/min configured, 41 requests, 0 429s; refused: ...``."""
    limit = f"{key['limit']:g}/min {key['limit_source'] or ''}".strip() if key.get("limit") else "unpaced"
    line = f"{key['hash']} ({key['source']}): {limit}, {key['requests']} requests, {key['rate_limited']} 429s"
    if key.get("refusal"):
        line += f"; refused: {key['refusal']}"
    if key.get("quota"):
        line += f"; {key['quota']}"
    return line


def _gateway_line(gateway: dict[str, Any]) -> str:
    """``1200 answered, 3 late (429), 0 unavailable (503); waited p50 0.012s, p99 1.900s``."""
    wait = gateway["wait"]
    waited = f"; waited p50 {wait['p50']:.3f}s, p99 {wait['p99']:.3f}s" if wait["count"] else ""
    return f"{gateway['answered']} answered, {gateway['late']} late (429), {gateway['unavailable']} unavailable (503){waited}"


def describe_report(report: dict[str, Any]) -> str:
    """The report for a person (``batchsum report run.json``; a report of schema 2 as well)."""
    report = upgrade_report(report)
    rows, requests, latency = report["rows"], report["requests"], report["latency"]
    utilization = report["utilization"]

    def by(counts: dict[str, int]) -> str:
        return " (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")" if counts else ""

    error = report.get("error")
    cause = f" ({report['cause']})" if report.get("cause") else ""
    outcome = report["outcome"] + cause + (f": {error['message']}" if error else "")
    cap = requests.get("max_requests")
    if latency["count"]:
        latencies = (
            f"p50 {latency['p50']:.3f}s, p90 {latency['p90']:.3f}s, p99 {latency['p99']:.3f}s, "
            f"max {latency['max']:.3f}s ({latency['count']} answers)"
        )
    else:
        latencies = "none measured"
    use = (
        f"{utilization['used_per_minute']:g}/min used the rate = {100 * utilization['of_plan']:.0f}% of the "
        f"plan's {utilization['plan_rpm']:g}/min (share {utilization['share']:g}); "
        f"{utilization['paid_per_minute']:g} paid/min"
        if utilization["of_plan"] is not None
        else f"{utilization['used_per_minute']:g}/min used the rate, {utilization['paid_per_minute']:g} paid/min, unpaced"
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
        + f", {requests['used_rate']} used the rate, {requests['rate_limited']} 429s, {requests['retried']} retries;"
        + f" {requests['reused']} rows reused"
        + (f" ({requests['from_store']} from the store)" if requests.get("from_store") else ""),
        f"pauses:       {len(report['pauses'])}",
        f"utilization:  {use}",
        f"latency:      {latencies}",
        *(f"gateway:      {_gateway_line(report['gateway'])}" for _ in [0] if report.get("gateway") is not None),
        *(
            f"key:          {_key_line(key)}"
            for key in report.get("keys") or []
            if len(report["keys"]) > 1 or key.get("refusal")
        ),
        "versions:     " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
    ]
    return "\n".join(lines)
