"""``batchsum top``: the keys on a budget and the runs on each, refreshed every second until Ctrl-C and
fit to the terminal's width (``--once``: one view; ``--json``: each view as one JSON object;
``--metrics-port``: the same figures served to Prometheus as well)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .console import EXIT_OK, EXIT_TERMINATED

if TYPE_CHECKING:  # the command line imports this module for every command: what top reads, when it runs
    from ..pacing.look.view import BudgetView, KeyView, RunView
    from ..run.budget_keys import Watcher

UNKNOWN = "unknown"  # pacing.look.view.UNKNOWN: a run's rows left where it does not know its size

__all__ = ["top_command", "render", "REFRESH_SECONDS", "MIN_WIDTH"]

REFRESH_SECONDS = 1.0
MIN_WIDTH = 40  # a narrower terminal is drawn at this width (its lines wrap)
_CLEAR = "\x1b[H\x1b[2J"  # to the top left, the screen cleared: each view replaces the last on a terminal


def top_command(args: argparse.Namespace) -> int:
    """``batchsum top``: read, draw, wait a second; again until Ctrl-C (``--once``: once)."""
    from ..run.budget_keys import Watcher

    watcher = Watcher(args.budget, service=args.service, this_key=args.this_key, keys=args.keys)
    metrics = None
    if args.metrics_port is not None:
        from ..run.key_metrics import KeyMetrics

        metrics = KeyMetrics.serve(args.metrics_port, args.metrics_address)
    clear = sys.stdout.isatty() and not args.json and not args.once
    try:
        return asyncio.run(_watch(watcher, args, metrics, clear))
    except KeyboardInterrupt:  # Ctrl-C: how a person leaves top
        signals = getattr(args, "signals", None)
        return EXIT_TERMINATED if signals is not None and signals.last == signal.SIGTERM else EXIT_OK
    finally:
        if metrics is not None:
            metrics.close()


async def _watch(watcher: Watcher, args: argparse.Namespace, metrics: Any, clear: bool) -> int:
    from ..run.budget_keys import as_json

    while True:
        began = time.monotonic()
        view = await watcher.read()
        if metrics is not None:
            metrics.show(view)
        if args.json:
            text = json.dumps(as_json(view), separators=(",", ":"))
        else:
            text = render(view, shutil.get_terminal_size().columns)
        print((_CLEAR if clear else "") + text, flush=True)
        if args.once:
            return EXIT_OK
        if not clear and not args.json:
            print(flush=True)  # views one after another, a blank line between
        await asyncio.sleep(max(0.0, REFRESH_SECONDS - (time.monotonic() - began)))


# -- the view in words, fit to the width --------------------------------------------------------------


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _limit_words(key: KeyView) -> str:
    if key.disagree:
        each = "; ".join(
            f"{limit.limit:g}/min ({limit.source or '?'}) for {len(limit.runs)} run{'s' if len(limit.runs) > 1 else ''}"
            for limit in key.limits
        )
        return f"runs disagree on the limit: {each}"
    if key.limit is None:
        return "limit unknown (no run paces it)"
    return f"limit {key.limit:g}/min ({key.limit_source or '?'})"


def _pace_words(key: KeyView) -> str:
    """``started 98 in the last 10 s (of 100 allowed), 590 in the last 60 s (of 600: 98%) · 0 429s``."""
    if key.limit:
        in_10s = f"{key.starts_10s} in the last 10 s (of {key.limit / 6:.0f} allowed)"
        in_60s = f"{key.rate_1m} in the last 60 s (of {key.limit:g}: {100 * key.rate_1m / key.limit:.0f}%)"
    else:
        in_10s, in_60s = f"{key.starts_10s} in the last 10 s", f"{key.rate_1m} in the last 60 s"
    return f"started {in_10s}, {in_60s} · {key.rate_limited_1m} 429s"


def _key_lines(key: KeyView, width: int) -> list[str]:
    from ..pacing.budgets.quota import utc

    name = f"key {key.key}" + (f" ({key.label})" if key.label else "") + f" at {key.service}"
    facts = [_limit_words(key), _pace_words(key)]
    if key.paused_until is not None:
        facts.append(f"paused until {_clock(key.paused_until)}" + (f": {key.pause_reason}" if key.pause_reason else ""))
    for quota in key.quotas:
        left = "spent" if quota.spent else ("? left" if quota.left is None else f"{quota.left} left")
        reset = f" until {utc(quota.reset_at)}" if quota.reset_at else ""
        facts.append(f"{quota.name} ({quota.source}): {left}{reset}")
    if key.search is not None:
        level = key.search.get("level")
        facts.append(f"search under way: {key.search.get('phase')}" + (f" at {level:.0f}/min" if level else ""))
    lines = textwrap.wrap(name, width) or [name]
    for fact in facts:
        lines += textwrap.wrap(fact, width, initial_indent="  ", subsequent_indent="    ")
    return lines


def _waits(run: RunView) -> str:
    """A gateway's requests' wait for their turn in the last minute: ``0.01s/0.4s`` (p50/p95)."""
    if run.wait_p50_s is None or run.wait_p95_s is None:
        return "-"
    return f"{run.wait_p50_s:.2g}s/{run.wait_p95_s:.2g}s"


# A run's columns, in order: header, the cell, and its priority (the lowest go first when the width is short).
_COLUMNS: list[tuple[str, Callable[[RunView], str], int]] = [
    ("RUN", lambda r: r.run_id, 9),
    ("HOST/PID", lambda r: f"{r.host}/{r.pid}" if r.pid is not None else f"{r.host} ({r.processes} procs)", 5),
    ("DOOR", lambda r: r.door or "-", 3),
    ("LIMIT", lambda r: _rate(r.rpm) + (f" {r.limit_source}" if r.limit_source else ""), 4),
    ("SHARE", lambda r: f"{r.share:g}", 6),
    ("SENT", lambda r: str(r.sent), 8),
    ("REUSED", lambda r: str(r.reused), 2),
    ("429S", lambda r: str(r.rate_limited), 7),
    ("LEFT", lambda r: "-" if r.rows_left is None else str(r.rows_left), 8),
    ("RATE", lambda r: str(r.rate_1m), 7),
    ("ETA", lambda r: _eta(r.eta_s) if r.rows_left not in (UNKNOWN, None) else "-", 6),
    ("QUEUE", lambda r: "-" if r.queue is None else str(r.queue), 3),
    ("WAIT", _waits, 2),
    ("OUTPUT", lambda r: r.output or "-", 1),
]
_GATEWAY = ("QUEUE", "WAIT")  # a gateway's own columns (its queue, its waits for a turn)
_FLEX = "OUTPUT"  # the one column cut to fit (its middle), never dropped while it has room for a few


def _cut(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    half = (width - 1) // 2
    return text[:half] + "…" + text[len(text) - (width - 1 - half) :]


def _table(runs: Sequence[RunView], width: int) -> list[str]:
    """The runs as a table within ``width``: the lowest-priority columns dropped until it fits, the
    output cut in its middle; the run id cut last. A gateway's columns only where a gateway is."""
    gateway = any(run.queue is not None for run in runs)
    columns = [column for column in _COLUMNS if gateway or column[0] not in _GATEWAY]
    rows = [[cell(run) for _, cell, _ in columns] for run in runs]
    names = [name for name, _, _ in columns]
    widths = [max([len(name)] + [len(row[i]) for row in rows]) for i, name in enumerate(names)]
    shown = list(range(len(names)))

    def total(columns: list[int]) -> int:
        return 2 + sum(widths[i] for i in columns) + 2 * (len(columns) - 1)

    flex = names.index(_FLEX)
    while total(shown) > width:
        need = total(shown) - width
        if flex in shown and widths[flex] - need >= 12:  # the output cut to fit
            widths[flex] -= need
            break
        droppable = [i for i in shown if names[i] != "RUN"]
        if not droppable:
            widths[0] = max(4, widths[0] - need)  # the run id, cut
            break
        shown.remove(min(droppable, key=lambda i: columns[i][2]))
    last = shown[-1]
    dropped = [i for i in range(len(names)) if i not in shown]

    def line(cells: list[str]) -> str:
        parts = [_cut(cells[i], widths[i]).ljust(widths[i]) if i != last else _cut(cells[i], widths[i]) for i in shown]
        return "  " + "  ".join(parts)

    lines = [line(names)]
    for run, row in zip(runs, rows):
        lines.append(line(row))
        under = [f"{names[i].lower()} {row[i]}" for i in dropped]  # what does not fit in a row: under it, in words
        under += [run.waiting] if run.waiting else []  # every key's quota spent: what it waits for
        if under:
            lines += textwrap.wrap(" · ".join(under), width, initial_indent="      ", subsequent_indent="      ")
    return lines


def render(view: BudgetView, width: int, now: float | None = None) -> str:
    """The view in words, every line within ``width`` columns (at least ``MIN_WIDTH``)."""
    width = max(MIN_WIDTH, width)
    now = time.time() if now is None else now
    head = f"batchsum top · {view.where} · {_clock(now)}"
    lines = textwrap.wrap(head, width)
    if not view.keys:
        lines += textwrap.wrap(
            "no key is in use on this budget now (no run on it, nothing sent in the last minute)", width
        )
    for key in view.keys:
        lines.append("")
        lines += _key_lines(key, width)
        if key.runs:
            lines += _table(key.runs, width)
        else:
            lines.append("  no run on it now")
    return "\n".join(lines)
