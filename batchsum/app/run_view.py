"""What the DataFrame app shows of a run as it goes: the bar, the state in words, the chart and
the rows in a paged table, redrawn from the run's ``BatchStats``; and how the run ended."""

from __future__ import annotations

import html
import time
from typing import Any

import ipywidgets as w
import pandas as pd

from ..data.results import RowResult
from ..engine.tally import BatchStats
from .controls import FULL, explain
from .table import ResultTable

__all__ = ["RunView", "describe_progress"]


class RunView:
    """The live view of one run of ``frame``: the rows finished so far (``rows``, shown as
    ``kind``), drawn at most four times a second, the chart and the table once a second."""

    def __init__(self, frame: pd.DataFrame) -> None:
        from .chart import RunChart

        self.progress = w.IntProgress(value=0, min=0, max=max(1, len(frame)), layout=w.Layout(width="100%"))
        self.status = w.HTML(layout=FULL)
        self.chart = RunChart()
        self.others = w.HTML(layout=FULL)  # beside the chart: what the other runs on the key use of it
        self.table = ResultTable(frame)
        self.rows: list[RowResult] = []
        self.kind: str | None = None
        self._last_draw = 0.0
        self._last_chart = 0.0

    def draw(self, stats: BatchStats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.25 and stats.done != stats.total:
            return
        self._last_draw = now
        total = stats.total or 1
        self.progress.value = stats.done
        self.progress.description = f"{100 * stats.done // total}%"
        self.status.value = describe_progress(stats)
        if stats.timeline is not None and (force or now - self._last_chart >= 1.0 or stats.done == stats.total):
            self._last_chart = now
            self.chart.update(stats.timeline.to_dict(), stats.total)
            self.table.show(self.rows, self.kind)

    def company(self, company: dict[str, Any] | None) -> None:
        """Beside the chart: the other runs on the run's key and how much of it they use."""
        if company is None:
            return
        limit = f" of its {company['limit']:g}/min" if company["limit"] else ""
        if not company["runs"]:
            self.others.value = "<span class='batchsum-help batchsum-company'>No other run on this key now.</span>"
            return
        runs = f"{company['runs']} other run{'s' if company['runs'] > 1 else ''}"
        self.others.value = (
            f"<span class='batchsum-help batchsum-company'>The key is shared: {runs} started "
            f"{company['others_1m']} requests in the last minute, this run {company['own_1m']}{limit}.</span>"
        )

    def finish(
        self, stats: BatchStats, result: pd.DataFrame, error: BaseException | None, cancelled: bool, of: int
    ) -> None:
        """The run is over (``of`` rows were asked for): the last state, every row, and how it ended."""
        done = len(self.rows)
        self.draw(stats, force=True)
        self.table.show(self.rows, self.kind, result)
        if error is not None:
            note = f"<span class='batchsum-error'>{html.escape(explain(error), quote=False)}</span> "
            self.status.value = note + f"{done} rows finished are in <code>.result</code>."
        elif cancelled:
            self.status.value = (
                f"Cancelled after {done} of {of} rows; they are in <code>.result</code>. "
                "Run again to continue: finished answers are reused."
            )


def describe_progress(stats: BatchStats) -> str:
    """The state in words (HTML): rows done by status, 429s, the time left at the pace in force, the
    pacer's state and its last change."""
    total = stats.total or 1
    state = stats.pacer_state()
    rate = stats.done / stats.elapsed if stats.elapsed > 0 else 0
    if state is not None and state.pace:  # rows still to send go at the pace, whatever came before
        rate = min(rate, state.pace / 60) if rate else state.pace / 60
    eta = f"{(total - stats.done) / rate:.0f}s" if rate and stats.done < total else "—"
    words = [
        f"{stats.done}/{total} rows",
        f"ok {stats.ok}",
        f"skipped {stats.skipped}",
        f"failed {stats.failed}",
        f"429s {stats.rate_limited}",
        f"ETA {eta}",
    ]
    words += [stats.waiting] if stats.waiting else []  # every key's quota spent: what the run waits for
    line = " · ".join(words) + (f" · {state.describe()}" if state is not None else "")
    changes = stats.pacer.changes[-1:] if stats.pacer is not None else []
    return html.escape(line, quote=False) + "".join(
        f"<br><span class='batchsum-help'>{html.escape(str(change))}</span>" for change in changes
    )
