"""The run chart (bqplot, updated in place inside ipywidgets): requests started per minute against
the plan's limit and the pace in force, 429s marked, pauses drawn as bands, rows done against the
total. ``RunChart`` is the DataFrame app's live chart; ``plot_run(out)`` draws a finished run from
``out.attrs["batchsum"]``.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

import numpy as np

try:
    import bqplot as bq
    import ipywidgets as w
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the run chart needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

__all__ = ["RunChart", "plot_run", "series"]

MAX_POINTS = 1500  # a long run is drawn from at most this many points per line
COLORS = {
    "rate": "#1f77b4",
    "limit": "#7f7f7f",
    "pace": "#2ca02c",
    "refused": "#d62728",
    "pause": "#ff7f0e",
    "done": "#9467bd",
}


def series(timeline: dict[str, Any]) -> dict[str, Any]:
    """The chart's lines from a timeline (``Timeline.to_dict()``): minutes since the start, requests
    started in the minute before each second, 429s, rows done so far, the pace steps, the pauses."""
    rows = np.asarray(timeline.get("seconds") or [[0, 0, 0, 0]], dtype=float).reshape(-1, 4)
    end = int(rows[:, 0].max()) + 1
    started, refused, done = (np.zeros(end) for _ in range(3))
    index = rows[:, 0].astype(int)
    np.add.at(started, index, rows[:, 1])
    np.add.at(refused, index, rows[:, 2])
    np.add.at(done, index, rows[:, 3])
    cumulative = np.concatenate([[0.0], np.cumsum(started)])
    per_minute = cumulative[1:] - cumulative[np.maximum(0, np.arange(1, end + 1) - 60)]
    step = max(1, end // MAX_POINTS)
    minutes = np.arange(end) / 60.0
    hits = np.nonzero(refused)[0]
    pace = timeline.get("pace") or [[0.0, timeline.get("rpm", 0.0)]]
    pace_x = [p[0] / 60 for p in pace] + [end / 60]
    pace_y = [p[1] for p in pace] + [pace[-1][1]]
    return {
        "minutes": minutes[::step],
        "per_minute": per_minute[::step],
        "done": np.cumsum(done)[::step],
        "refused_at": minutes[hits],
        "refused_rate": per_minute[hits],
        "pace_x": pace_x,
        "pace_y": pace_y,
        "pauses": [(start / 60, until / 60, why) for start, until, why in timeline.get("pauses") or []],
        "end": end / 60,
        "rpm": float(timeline.get("rpm") or 0.0),
    }


class RunChart:
    """One bqplot figure, updated in place by ``update(timeline, total)`` (no image re-rendered)."""

    def __init__(self, *, title: str = "The run", height: str = "300px") -> None:
        x, y, done_scale = bq.LinearScale(min=0.0), bq.LinearScale(min=0.0), bq.LinearScale(min=0.0)
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
            labels=["started in the last minute"],
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
        axes = [
            bq.Axis(scale=x, label="minutes since the start", grid_lines="none"),
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
                ("rate", "━", "requests started in the last minute"),
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
        end = max(data["end"], 1 / 60)
        with self.figure.hold_sync():
            self.limit.x, self.limit.y = [0, end], [data["rpm"], data["rpm"]]
            self.limit.visible = bool(data["rpm"])
            self.pace.x, self.pace.y = data["pace_x"], data["pace_y"]
            self.pace.visible = bool(data["rpm"])
            self.rate.x, self.rate.y = data["minutes"], data["per_minute"]
            self.refused.x, self.refused.y = data["refused_at"], data["refused_rate"]
            pauses = data["pauses"]
            if pauses:
                self.paused.x = [[start, until] for start, until, _ in pauses]
                self.paused.y = [[0, 0] for _ in pauses]
            self.paused.visible = bool(pauses)
            self.done.x, self.done.y = data["minutes"], data["done"]
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
