"""``batchsum.monitor()``: the keys on a budget, live in a notebook (``KeyMonitor``): a key's starts per
10 s against its limit over the last 15 minutes, each run's part of them stacked, 429s and pauses
marked; the key's figures in words and its runs in a table. It reads the budget once a second (never
writing it) on a thread of its own, and stops when closed. ``KeyHistory`` is the arithmetic behind
the chart, without a browser.
"""

from __future__ import annotations

import asyncio
import html
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as w

try:
    import bqplot as bq
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the monitor needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

from ..run.background import BackgroundRun
from ..run.budget_keys import HISTORY_SECONDS, UNKNOWN, BudgetView, KeyView, RunView, Watcher
from ..service.errors import BatchsumError
from .controls import STYLE

__all__ = ["KeyMonitor", "KeyHistory", "WINDOW_SECONDS", "BUCKET", "POLL_SECONDS"]

WINDOW_SECONDS = 900.0  # the chart's last 15 minutes
BUCKET = 10.0  # seconds a bar counts
POLL_SECONDS = 1.0
PALETTE = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f"]
EARLIER = "#b0b0b0"  # starts no run on the key now accounts for (before the monitor opened, runs gone)
REFUSED, LIMIT, PAUSE = "#d62728", "#7f7f7f", "#ff7f0e"


class KeyHistory:
    """One key's last 15 minutes as the monitor has seen it: the key's starts and 429s per ``BUCKET``
    (from its ledger: every process's), each run's starts (the growth of what it published, from when
    the monitor first saw it), the limit in force and the pauses, on the budget's clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.buckets: dict[float, tuple[int, int]] = {}  # bucket start -> (starts, 429s)
        self.by_run: dict[float, dict[str, int]] = {}  # bucket start -> run id -> its starts
        self.limits: dict[float, float] = {}  # bucket start -> the limit per minute
        self.pauses: list[tuple[float, float]] = []
        self.runs: list[str] = []  # run ids in the order they came (their colours)
        self._sent: dict[str, int] = {}

    def add(self, key: KeyView, seconds: float) -> None:
        """What a read of ``seconds`` of the key's ledger showed."""
        now = self.now = key.now
        bucket = math.floor(now / BUCKET) * BUCKET
        since = now - seconds + BUCKET  # a bucket at the read's far edge was read in part: kept as it was
        for start, starts, refused in key.history:
            if start >= since or start not in self.buckets:
                self.buckets[start] = (starts, refused)
        for run in key.runs:
            before = self._sent.get(run.run_id)
            if before is not None and run.sent > before:
                counts = self.by_run.setdefault(bucket, {})
                counts[run.run_id] = counts.get(run.run_id, 0) + run.sent - before
            self._sent[run.run_id] = run.sent
            if run.run_id not in self.runs:
                self.runs.append(run.run_id)
        if key.limit:
            self.limits[bucket] = key.limit
        if key.paused_until is not None:
            if self.pauses and self.pauses[-1][1] >= now:
                self.pauses[-1] = (self.pauses[-1][0], max(self.pauses[-1][1], key.paused_until))
            else:
                self.pauses.append((now, key.paused_until))
        self._forget(now - WINDOW_SECONDS - BUCKET)

    def _forget(self, before: float) -> None:
        self.buckets = {s: v for s, v in self.buckets.items() if s >= before}
        self.by_run = {s: v for s, v in self.by_run.items() if s >= before}
        self.limits = {s: v for s, v in self.limits.items() if s >= before}
        self.pauses = [(a, b) for a, b in self.pauses if b >= before]

    def series(self) -> dict[str, Any]:
        """The chart's data, times in minutes before now (-15 .. 0): ``x`` the buckets' middles;
        ``stacks`` (run id -> starts per bucket, ``earlier`` last: what no run seen accounts for);
        ``total``; ``limit`` per bucket (starts a limit allows in 10 s; NaN: none known); ``refused_x``,
        ``refused_y`` (a bucket's 429s, on its bar); ``pauses`` (from, until)."""
        end = math.floor(self.now / BUCKET) * BUCKET
        starts = [end - BUCKET * i for i in range(int(WINDOW_SECONDS // BUCKET), -1, -1)]
        x = [(start + BUCKET / 2 - self.now) / 60.0 for start in starts]
        total = [self.buckets.get(start, (0, 0))[0] for start in starts]
        stacks: dict[str, list[float]] = {}
        for run_id in self.runs:
            stacks[run_id] = [float(self.by_run.get(start, {}).get(run_id, 0)) for start in starts]
        known = [sum(stack[i] for stack in stacks.values()) for i in range(len(starts))]
        stacks["earlier"] = [float(max(0, total[i] - known[i])) for i in range(len(starts))]
        known_limits = [self.limits[start] for start in starts if start in self.limits]
        limit, last = [], known_limits[0] if known_limits else math.nan  # before the first look: the first known
        for start in starts:
            last = self.limits.get(start, last)
            limit.append(last * BUCKET / 60.0)
        hits = [i for i, start in enumerate(starts) if self.buckets.get(start, (0, 0))[1]]
        return {
            "x": x,
            "stacks": stacks,
            "total": total,
            "limit": limit,
            "refused_x": [x[i] for i in hits],
            "refused_y": [float(max(total[i], known[i])) for i in hits],
            "refused": [self.buckets[starts[i]][1] for i in hits],
            "pauses": [((a - self.now) / 60.0, (min(b, self.now) - self.now) / 60.0) for a, b in self.pauses],
        }


class _Chart:
    """The bqplot figure of one key's history, updated in place."""

    def __init__(self) -> None:
        x, y = bq.LinearScale(min=-WINDOW_SECONDS / 60.0, max=0.0), bq.LinearScale(min=0.0)
        scales = {"x": x, "y": y}
        self.bars = bq.Bars(x=[0.0], y=[[0.0]], scales=scales, type="stacked", colors=[EARLIER], padding=0.15)
        self.limit = bq.Lines(x=[0.0], y=[0.0], scales=scales, colors=[LIMIT], line_style="dashed")
        self.refused = bq.Scatter(x=[], y=[], scales=scales, colors=[REFUSED], marker="cross", default_size=48)
        self.paused = bq.Lines(x=[[0, 0]], y=[[0, 0]], scales=scales, colors=[PAUSE], stroke_width=8, visible=False)
        axes = [
            bq.Axis(scale=x, label="minutes before now", grid_lines="none"),
            bq.Axis(scale=y, side="left", label="starts per 10 s", grid_lines="dashed"),
        ]
        self.figure = bq.Figure(
            marks=[self.bars, self.limit, self.paused, self.refused],
            axes=axes,
            animation_duration=0,
            fig_margin={"top": 20, "bottom": 45, "left": 60, "right": 20},
            layout=w.Layout(width="100%", max_width="1000px", height="280px"),
        )
        self.figure.add_class("batchsum-monitor-chart")
        key = " &nbsp; ".join(
            f"<span style='color:{color}'>{symbol}</span> {words}"
            for color, symbol, words in [
                (PALETTE[0], "■", "each run's starts (its colour in the table)"),
                (EARLIER, "■", "starts of runs not seen (before the monitor opened, or gone)"),
                (LIMIT, "╌", "what the limit allows in 10 s"),
                (REFUSED, "✚", "429s"),
                (PAUSE, "▬", "paused"),
            ]
        )
        self.widget = w.VBox(
            [self.figure, w.HTML(f"<div class='batchsum-chart-key' style='font-size:85%'>{key}</div>")],
            layout=w.Layout(width="100%", max_width="1000px"),
        )

    def update(self, history: KeyHistory, colors: Mapping[str, str]) -> None:
        data = history.series()
        stacks = data["stacks"]
        with self.figure.hold_sync():
            self.bars.x = data["x"]
            self.bars.y = [stacks[run_id] for run_id in stacks]
            self.bars.colors = [colors.get(run_id, EARLIER) for run_id in stacks]
            self.limit.x, self.limit.y = data["x"], data["limit"]
            self.refused.x, self.refused.y = data["refused_x"], data["refused_y"]
            pauses = data["pauses"]
            if pauses:
                self.paused.x = [[a, b] for a, b in pauses]
                self.paused.y = [[0, 0] for _ in pauses]
            self.paused.visible = bool(pauses)


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def describe_key(key: KeyView) -> str:
    """The key's figures in words (HTML)."""
    name = f"key <b>{html.escape(key.key)}</b>" + (f" ({html.escape(key.label)})" if key.label else "")
    if key.disagree:
        limit = "runs disagree: " + "; ".join(
            f"{item.limit:g}/min ({html.escape(item.source or '?')}) for {len(item.runs)}" for item in key.limits
        )
    elif key.limit is not None:
        limit = f"limit {key.limit:g}/min ({html.escape(key.limit_source or '?')})"
    else:
        limit = "limit unknown"
    against = f" of {key.limit:g}" if key.limit else ""
    words = [
        f"{name} at {html.escape(key.service)}",
        limit,
        f"{key.starts_10s} started in 10 s, {key.rate_1m} in 60 s{against}",
        f"{key.rate_limited_1m} 429s in 60 s",
    ]
    if key.paused_until is not None:
        words.append(f"paused until {_clock(key.paused_until)}: {html.escape(key.pause_reason or '')}")
    for quota in key.quotas:
        left = "spent" if quota.spent else f"{quota.left if quota.left is not None else '?'} left"
        words.append(f"{html.escape(quota.name)} ({quota.source}): {left}")
    if key.search is not None:
        words.append(f"search under way: {html.escape(str(key.search.get('phase')))}")
    return " · ".join(words)


_HEAD = ["", "run", "host/pid", "door", "output", "limit", "share", "sent", "reused", "429s", "left", "rate", "ETA"]


def runs_table(runs: Sequence[RunView], colors: Mapping[str, str]) -> str:
    """The runs on the key, one row each, its colour on the chart first (HTML)."""

    def cells(run: RunView) -> list[str]:
        who = f"{run.host}/{run.pid}" if run.pid is not None else f"{run.host} ({run.processes} processes)"
        eta = "-" if run.eta_s is None or run.rows_left in (UNKNOWN, None) else f"{run.eta_s:.0f} s"
        values = [
            run.run_id,
            who,
            run.door or "-",
            run.output or "-",
            f"{run.rpm:g} {run.limit_source or ''}" if run.rpm else "-",
            f"{run.share:g}",
            str(run.sent),
            str(run.reused),
            str(run.rate_limited),
            "-" if run.rows_left is None else str(run.rows_left),
            f"{run.rate_1m}/min",
            eta,
        ]
        swatch = f"<span style='color:{colors.get(run.run_id, EARLIER)}'>■</span>"
        cells = [swatch] + [html.escape(v) for v in values]
        if run.output:  # the path's end in the table, the whole of it on hover
            cells[4] = f"<span title='{html.escape(run.output)}'>{html.escape(_tail(run.output))}</span>"
        return cells

    head = "".join(f"<th>{html.escape(name)}</th>" for name in _HEAD)
    style = (
        "<style>.batchsum-runs { table-layout: auto; } .batchsum-runs td, .batchsum-runs th"
        " { white-space: nowrap; overflow-wrap: normal; }</style>"
    )
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells(run)) + "</tr>" for run in runs)
    if not runs:
        body = f"<tr><td colspan='{len(_HEAD)}'>no run on this key now</td></tr>"
    return f"{style}<table class='batchsum-table batchsum-runs'><tr>{head}</tr>{body}</table>"


def _tail(location: str, chars: int = 32) -> str:
    """The end of a location (its file's name, and as much of its folder as fits)."""
    return location if len(location) <= chars else "…" + location[-(chars - 1) :]


class KeyMonitor:
    """The live view of the keys on a budget (``batchsum.monitor()``; options as ``batchsum top``'s):
    one key at a time (a menu when several are in use), read every ``POLL_SECONDS`` on a thread of its
    own until ``close()`` (its Close button, or the widget closed). ``polls``: reads done so far."""

    def __init__(
        self,
        budget: str | None = None,
        *,
        service: str | None = None,
        this_key: bool = False,
        keys: str | Path | None = None,
    ) -> None:
        self.watcher = Watcher(budget, service=service, this_key=this_key, keys=keys)
        self.histories: dict[str, KeyHistory] = {}
        self.view: BudgetView | None = None
        self.polls = 0
        self.closed = False
        self.title = w.HTML(f"<b>batchsum monitor</b> · {html.escape(self.watcher.display)}")
        self.key = w.Dropdown(options=[], layout=w.Layout(width="auto", display="none"))
        self.close_button = w.Button(description="Close", icon="times", layout=w.Layout(width="auto"))
        self.state = w.HTML("<i>Reading the budget…</i>", layout=w.Layout(width="100%"))
        self.chart = _Chart()
        self.table = w.HTML(layout=w.Layout(width="100%"))
        self.box = w.VBox(
            [
                w.HTML(STYLE),
                w.HBox([self.title, self.key, self.close_button]),
                self.state,
                self.chart.widget,
                self.table,
            ],
            layout=w.Layout(width="100%", max_width="1000px"),
        )
        self.box.add_class("batchsum-app")
        self.box.add_class("batchsum-monitor")
        self.state.add_class("batchsum-monitor-state")
        self.close_button.on_click(lambda _: self.close())
        self.key.observe(lambda _: self._draw(), names="value")
        self._colors: dict[str, str] = {}
        self._poller = BackgroundRun(self._poll)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)

    async def _poll(self) -> None:
        seconds = HISTORY_SECONDS  # the first look takes all the ledger the budget keeps; then the last minute
        while not self.closed and self.box.comm is not None:
            began = time.monotonic()
            try:
                view = await self.watcher.read(seconds)
            except BatchsumError as exc:
                self.state.value = f"<span class='batchsum-error'>{html.escape(str(exc))}</span>"
            else:
                self._take(view, seconds)
                seconds = 70.0
            self.polls += 1
            await asyncio.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - began)))

    def _take(self, view: BudgetView, seconds: float) -> None:
        self.view = view
        for key in view.keys:
            self.histories.setdefault(key.key, KeyHistory()).add(key, seconds)
            for run in key.runs:
                self._colors.setdefault(run.run_id, PALETTE[len(self._colors) % len(PALETTE)])
        options = [(f"{k.key} ({k.label})" if k.label else k.key, k.key) for k in view.keys]
        if [value for _, value in options] != [value for _, value in self.key.options]:
            chosen = self.key.value
            self.key.options = options
            if chosen in [value for _, value in options]:
                self.key.value = chosen
        self.key.layout.display = "" if len(options) > 1 else "none"
        self._draw()

    def _draw(self) -> None:
        view = self.view
        if view is None:
            return
        key = next((k for k in view.keys if k.key == self.key.value), view.keys[0] if view.keys else None)
        if key is None:
            self.state.value = "No key is in use on this budget now: no run on it, nothing sent in the last minute."
            self.table.value = ""
            return
        self.state.value = describe_key(key)
        self.chart.update(self.histories[key.key], self._colors)
        self.table.value = runs_table(key.runs, self._colors)

    def close(self) -> None:
        """Stop reading the budget and close the widget."""
        self.closed = True
        self._poller.cancel()
        self.box.close()
