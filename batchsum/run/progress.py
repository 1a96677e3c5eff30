"""A progress bar fed by the engine's stats: done/total, ok/skipped/failed, 429s, pace, ETA.

``tqdm.auto`` picks a notebook widget in Jupyter and a text bar (on stderr) in a terminal.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import IO, Any

from ..engine.tally import BatchStats

__all__ = ["ProgressBar"]


class ProgressBar:
    """Call it with the engine's ``BatchStats`` after each row (``on_result=bar``)."""

    def __init__(
        self, total: int | None, *, enabled: bool = True, file: IO[str] | None = None, desc: str = "summarize"
    ) -> None:
        self._bar: Any = None  # no bar at all when it is off (``progress=False``, ``--quiet``): tqdm is not loaded
        self._shown: Any = None
        self._last_postfix = 0.0
        if not enabled:
            return
        from tqdm.auto import tqdm

        # In Jupyter the bar is a widget, and its text (what a saved notebook shows) is taken when it is
        # displayed, at 0%: displayed here under an id, so that close() can replace that text.
        widget = any(kind.__module__ == "tqdm.notebook" for kind in tqdm.__mro__)
        shown_later: dict[str, Any] = {"display": False} if widget else {}
        bar: Any = tqdm(
            total=total,
            file=file,
            desc=desc,
            unit="row",
            dynamic_ncols=True,
            smoothing=0.05,
            **shown_later,
        )
        self._bar = bar
        if widget:
            from IPython import display

            show: Any = display.display
            self._shown = show(bar.container, display_id=True)

    def __call__(self, stats: BatchStats) -> None:
        if self._bar is None:
            return
        # The row count and the counts after it are drawn together, so they always agree.
        now = time.monotonic()
        if now - self._last_postfix >= 0.5 or stats.done == stats.total:
            self._last_postfix = now
            if stats.work_total is not None and self._bar.total != stats.work_total:
                self._bar.total = stats.work_total  # a long text's parts are work too
                container = getattr(self._bar, "container", None)
                if container is not None:  # the notebook widget keeps its own length
                    container.children[1].max = stats.work_total
            self._bar.n = stats.work_done
            # Rows answered from the journal arrive at once: the rate (and so the ETA) counts only
            # the rest (tqdm's rate is (n - initial) / elapsed when n is set, not updated).
            self._bar.initial = min(stats.reused, stats.work_done)
            self._bar.set_postfix_str(self.describe(stats), refresh=False)
            self._bar.refresh()

    @staticmethod
    def describe(stats: BatchStats) -> str:
        """``ok 10 · skipped 1 · failed 0 · 429s 2 · waiting 41 s: the service answered 429
        (Retry-After 41) · pace 480/min · in flight 12``; ``ok 10 · from the store 8 · ...`` when the
        answer store answered rows."""
        state = stats.pacer_state()
        pacer = state.describe() if state is not None else "no pacing"
        store = f" · from the store {stats.from_store}" if stats.from_store else ""
        waits = f" · {stats.waiting}" if stats.waiting else ""  # every key's quota spent: until when
        counts = f"ok {stats.ok}{store} · skipped {stats.skipped} · failed {stats.failed} · 429s {stats.rate_limited}"
        return f"{counts}{waits} · {pacer}"

    async def follow(self, stats: BatchStats, every: float = 1.0) -> None:
        """Refresh the line while no row finishes (a pause, slow answers), so it never looks frozen."""
        while self._bar is not None:
            await asyncio.sleep(every)
            self._last_postfix = 0.0
            self(stats)

    def write(self, message: str) -> None:
        """A line above the bar (or on stderr when the bar is off)."""
        if self._bar is None or self._bar.disable:
            print(message, file=sys.stderr, flush=True)
        else:
            self._bar.write(message, file=self._bar.fp)

    def close(self) -> None:
        if self._bar is None:
            return
        self._bar.close()
        if self._shown is not None:  # the widget's text as the bar ended
            self._shown.update(self._bar.container)
            self._shown = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
