"""The run chart (bqplot, updated in place inside ipywidgets): requests started per minute against
the plan's limit and the pace in force, 429s marked, pauses drawn as bands, rows done against the
total. ``RunChart`` is the DataFrame app's live chart; ``plot_run(out)`` draws a finished run from
``out.attrs["batchsum"]``; ``series(timeline)`` is the arithmetic behind both, without a browser.

How the chart reads at any run length:

- the rate line is *requests started in the trailing window, per minute*, where the window is the
  last minute, or the run so far while the run is shorter than that. A 20 s run at 600/min reads
  ~600, not the ~200 a trailing minute would show (40 of its 60 s had not happened yet);
- the time axis is in seconds for a run up to three minutes long, in minutes beyond, with ticks
  on round values (every 1, 2, 5, 10, 15, 20, 30 s ...; every 1, 2, 5, 10 ... minutes), so a
  short run never ticks in hundredths of a minute;
- a 429 is a cross on the rate line in the middle of the second it came in; a pause is a band
  along the time axis from when it began until it ended.
"""

from __future__ import annotations

import html
import json
import math
import os
from typing import Any

import numpy as np

try:
    import bqplot as bq
    import ipywidgets as w
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the run chart needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

__all__ = ["RunChart", "axis_unit", "plot_run", "round_ticks", "series"]

MAX_POINTS = 1500  # a long run is drawn from at most this many points per line
COLORS = {
    "rate": "#1f77b4",
    "limit": "#7f7f7f",
    "pace": "#2ca02c",
    "refused": "#d62728",
    "pause": "#ff7f0e",
    "done": "#9467bd",
}


WINDOW = 60  # seconds: the rate line counts the requests started in the trailing minute...
SECONDS_UP_TO = 180  # ...and a run up to three minutes long is drawn in seconds, longer ones in minutes
MAX_TICKS = 10
# Round tick steps in the axis's unit (seconds or minutes): the first that needs at most MAX_TICKS.
TICK_STEPS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 360, 720, 1440, 2880)


def axis_unit(length: float) -> tuple[str, float]:
    """The time axis for a run ``length`` seconds long: its unit and seconds per unit, ("seconds", 1)
    up to three minutes, ("minutes", 60) beyond (a short run in minutes ticks in hundredths)."""
    return ("seconds", 1.0) if length <= SECONDS_UP_TO else ("minutes", 60.0)


def round_ticks(end: float) -> list[float]:
    """Ticks from 0 to ``end`` (in the axis's unit) on the first round step that needs at most
    ``MAX_TICKS`` intervals."""
    end = max(float(end), 1.0)
    step = next((float(s) for s in TICK_STEPS if end / s <= MAX_TICKS), None)
    if step is None:  # beyond two days of minutes: a power of ten
        step = float(10 ** math.ceil(math.log10(end / MAX_TICKS)))
    return [i * step for i in range(int(end // step) + 1)]


def series(timeline: dict[str, Any]) -> dict[str, Any]:
    """The chart's lines from a timeline (``Timeline.to_dict()``, whole-second rows of
    [second, started, refused, done]), every time in the axis's ``unit`` (``scale`` seconds each):

    - ``x``, ``per_minute``: at the end of each second, the requests started in the trailing window
      (the last ``WINDOW`` seconds, or the run so far when shorter) scaled to a minute; the first
      second's rate is drawn from time 0 so the line starts with the run;
    - ``x``, ``done``: rows done by then (0 at 0);
    - ``refused_at``, ``refused_rate``: a 429 in the middle of its second, on the rate line;
    - ``pace_x``, ``pace_y``: the pace in force, a step at each change;
    - ``pauses``: (from, until, why); ``end``: where the axis ends; ``ticks``: its round ticks;
    - ``rpm``: the plan's limit (0 when none was given).
    """
    rows = np.asarray(timeline.get("seconds") or [[0, 0, 0, 0]], dtype=float).reshape(-1, 4)
    seconds = int(rows[:, 0].max()) + 1  # whole seconds the run has reached
    started, refused, done = (np.zeros(seconds) for _ in range(3))
    index = rows[:, 0].astype(int)
    np.add.at(started, index, rows[:, 1])
    np.add.at(refused, index, rows[:, 2])
    np.add.at(done, index, rows[:, 3])
    cumulative = np.concatenate([[0.0], np.cumsum(started)])
    ends = np.arange(1, seconds + 1)  # the end of each second, in seconds since the start
    window = np.minimum(WINDOW, ends)
    per_minute = (cumulative[ends] - cumulative[ends - window]) * 60.0 / window
    pace = timeline.get("pace") or [[0.0, timeline.get("rpm", 0.0)]]
    pauses = timeline.get("pauses") or []
    length = max([float(seconds)] + [float(p[1]) for p in pauses] + [float(p[0]) for p in pace])
    unit, scale = axis_unit(length)
    # A long run is drawn from at most MAX_POINTS points per line, always with its last one.
    step = max(1, seconds // MAX_POINTS)
    kept = np.unique(np.concatenate([np.arange(0, seconds, step), [seconds - 1]]))
    times = np.concatenate([[0.0], ends[kept]])
    rates = np.concatenate([per_minute[:1], per_minute[kept]])
    hits = np.nonzero(refused)[0] + 0.5
    return {
        "unit": unit,
        "scale": scale,
        "x": times / scale,
        "per_minute": rates,
        "done": np.concatenate([[0.0], np.cumsum(done)[kept]]),
        "refused_at": hits / scale,
        "refused_rate": np.interp(hits, np.concatenate([[0.0], ends]), np.concatenate([per_minute[:1], per_minute])),
        "pace_x": [p[0] / scale for p in pace] + [length / scale],
        "pace_y": [p[1] for p in pace] + [pace[-1][1]],
        "pauses": [(start / scale, until / scale, why) for start, until, why in pauses],
        "end": length / scale,
        "ticks": round_ticks(length / scale),
        "rpm": float(timeline.get("rpm") or 0.0),
    }


class RunChart:
    """One bqplot figure, updated in place by ``update(timeline, total)`` (no image re-rendered); what
    it draws and on which axis is ``series(timeline)``."""

    def __init__(self, *, title: str = "The run", height: str = "300px") -> None:
        x, y, done_scale = bq.LinearScale(min=0.0, max=1.0), bq.LinearScale(min=0.0), bq.LinearScale(min=0.0)
        self.x_scale = x
        scales = {"x": x, "y": y}
        self.limit = bq.Lines(
            x=[0, 1],
            y=[0, 0],
            scales=scales,
            colors=[COLORS["limit"]],
            line_style="dashed",
            labels=["plan's limit"],
            display_legend=True,
        )
        self.pace = bq.Lines(
            x=[0],
            y=[0],
            scales=scales,
            colors=[COLORS["pace"]],
            interpolation="step-after",
            labels=["pace in force"],
            display_legend=True,
        )
        self.rate = bq.Lines(
            x=[0],
            y=[0],
            scales=scales,
            colors=[COLORS["rate"]],
            stroke_width=2,
            labels=["started per minute"],
            display_legend=True,
        )
        self.refused = bq.Scatter(
            x=[],
            y=[],
            scales=scales,
            colors=[COLORS["refused"]],
            marker="cross",
            default_size=48,
            labels=["429"],
            display_legend=True,
        )
        self.paused = bq.Lines(
            x=[[0, 0]],
            y=[[0, 0]],
            scales=scales,
            colors=[COLORS["pause"]],
            stroke_width=8,
            opacities=[0.7],
            labels=["paused"],
            display_legend=True,
            visible=False,
        )
        self.done = bq.Lines(
            x=[0],
            y=[0],
            scales={"x": x, "y": done_scale},
            colors=[COLORS["done"]],
            line_style="dotted",
            labels=["rows done"],
            display_legend=True,
        )
        self.total = bq.Lines(
            x=[0, 1],
            y=[0, 0],
            scales={"x": x, "y": done_scale},
            colors=[COLORS["done"]],
            opacities=[0.35],
            line_style="dashed",
            visible=False,
        )
        self.time_axis = bq.Axis(scale=x, label="seconds since the start", grid_lines="none", tick_values=[0.0, 1.0])
        axes = [
            self.time_axis,
            bq.Axis(scale=y, side="left", label="requests per minute", grid_lines="dashed"),
            bq.Axis(scale=done_scale, side="right", label="rows done", grid_lines="none"),
        ]
        marks = [self.limit, self.pace, self.rate, self.paused, self.refused, self.done, self.total]
        for mark in marks:
            mark.display_legend = False  # the key is a caption under the chart: a legend box hides the lines
        self.figure = bq.Figure(
            marks=marks,
            axes=axes,
            title=title,
            animation_duration=0,
            fig_margin={"top": 40, "bottom": 45, "left": 60, "right": 60},
            layout=w.Layout(width="100%", max_width="1000px", height=height),
        )
        self.figure.add_class("batchsum-chart")
        key = " &nbsp; ".join(
            f"<span style='color:{COLORS[name]}'>{symbol}</span> {html.escape(words)}"
            for name, symbol, words in [
                ("rate", "━", "requests started per minute (over the last minute, or the run so far)"),
                ("limit", "╌", "the plan's limit"),
                ("pace", "━", "the pace in force"),
                ("refused", "✚", "429"),
                ("pause", "▬", "paused"),
                ("done", "┈", "rows done (right axis)"),
            ]
        )
        self.widget = w.VBox(
            [self.figure, w.HTML(f"<div class='batchsum-chart-key' style='font-size:85%'>{key}</div>")],
            layout=w.Layout(width="100%", max_width="1000px"),
        )

    def update(self, timeline: dict[str, Any] | None, total: int | None = None) -> None:
        if not timeline:
            return
        data = series(timeline)
        end = data["end"]
        with self.figure.hold_sync():
            self.x_scale.max = float(end)
            self.time_axis.label = f"{data['unit']} since the start"
            self.time_axis.tick_values = data["ticks"]
            self.limit.x, self.limit.y = [0, end], [data["rpm"], data["rpm"]]
            self.limit.visible = bool(data["rpm"])
            self.pace.x, self.pace.y = data["pace_x"], data["pace_y"]
            self.pace.visible = bool(data["rpm"])
            self.rate.x, self.rate.y = data["x"], data["per_minute"]
            self.refused.x, self.refused.y = data["refused_at"], data["refused_rate"]
            pauses = data["pauses"]
            if pauses:
                self.paused.x = [[start, until] for start, until, _ in pauses]
                self.paused.y = [[0, 0] for _ in pauses]
            self.paused.visible = bool(pauses)
            self.done.x, self.done.y = data["x"], data["done"]
            if total:
                self.total.x, self.total.y = [0, end], [total, total]
            self.total.visible = bool(total)


def plot_run(result: Any) -> Any:
    """The chart of a finished run: ``batchsum.plot_run(out)`` for an accessor's result (its
    ``attrs["batchsum"]``), the record itself, or a run report (its dict, or its file's path). Returns a widget: the bqplot figure and its key."""
    if isinstance(result, (str, os.PathLike)):  # a run report's file
        with open(result, encoding="utf-8") as file:
            result = json.load(file)
    record = result.attrs.get("batchsum") if hasattr(result, "attrs") else result
    if isinstance(record, dict) and "outcome" in record and "account" not in record:  # a run report
        record = {**record, "account": f"run {record.get('run_id')}: {record.get('outcome')}"}
    if not isinstance(record, dict) or not record.get("timeline"):
        raise ValueError("no run to draw: pass the DataFrame a batchsum accessor returned (out.attrs['batchsum'])")
    chart = RunChart(title=record.get("account", "The run"))
    chart.update(record["timeline"], record["timeline"].get("total"))
    return chart.widget
