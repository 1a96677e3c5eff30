"""What a run tells those who follow it (``Watch``): its events as it goes (start, pace, pause,
progress), its metrics and progress bar, and when it ends, its report and its last events."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..engine.tally import BatchStats
from ..pacing import PaceChange
from ..service.version import __version__
from .logs import event
from .pieces import Pieces
from .report import run_report, write_report
from .spec import RunSpec
from .telemetry import Metrics

__all__ = ["Watch", "PROGRESS_SECONDS", "WATCH_SECONDS"]

log = logging.getLogger("batchsum")

PROGRESS_SECONDS = 10.0  # between two progress events
WATCH_SECONDS = 0.25  # how often the run looks for a pause starting or ending


class Watch:
    """The watch over one run of ``spec`` counted in ``stats``, over its ``pieces`` once open."""

    def __init__(self, spec: RunSpec, stats: BatchStats, pieces: Pieces, run_id: str, *, shared: bool) -> None:
        self.spec = spec
        self.stats = stats
        self.pieces = pieces
        self.run_id = run_id
        self.shared = shared
        self._metrics: Metrics | None = None
        self._ticker: asyncio.Future[None] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self._paused = False  # what the last pause event said
        self._budget: tuple[str, float] | None = None  # the wait for the budget said, since when

    def start(self) -> None:
        """The pieces are open: metrics, the bar's refreshes, the watch for pauses, the start event."""
        spec, stats = self.spec, self.stats
        pacer = stats.pacer or self.pieces.pacer  # over several keys, the sum of their paces
        stats.telemetry = self._metrics = Metrics.open(self.run_id, lambda: pacer.pace, __version__)
        if spec.progress:
            self._ticker = asyncio.ensure_future(self.pieces.bar.follow(stats))
        self._watcher = asyncio.ensure_future(self._watch())
        event(
            "start",
            f"run {self.run_id} started: {stats.total if stats.total is not None else 'unknown'} rows",
            run_id=self.run_id,
            total=stats.total,
            options=spec.describe(),
            keys=[lane.describe() for lane in self.pieces.lanes],
        )

    async def stop(self) -> None:
        """The bar's refreshes and the watch for pauses end; a pause that ended since the watch last
        looked is said to have ended (every pause event has its resume, unless the run ends paused)."""
        for task in (self._ticker, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._watcher is not None:
            self._look_for_pause()

    def report(self, error: BaseException | None, started_at: float) -> dict[str, Any]:
        """The run has ended, however (``error``: what ended it, if not its end): its metrics stop,
        and its report."""
        if self._metrics is not None:
            self._metrics.close()
        error = None if isinstance(error, GeneratorExit) else error
        return run_report(
            self.stats,
            run_id=self.run_id,
            options=self.spec.describe(),
            started_at=started_at,
            ended_at=time.time(),
            error=error,
            keys=[lane.describe() for lane in self.pieces.lanes],
            door=self.spec.door,
        )

    def end(self, report: dict[str, Any]) -> None:
        """The run's report written (``report=``), the stop or error event, the end event."""
        if self.spec.report is not None:
            try:
                write_report(self.spec.report, report, shared=self.shared)
            except OSError as exc:
                log.warning("could not write the run report %s: %s", self.spec.report, exc)
        if report["error"] is not None:
            kind = "stop" if report["outcome"] == "stopped" else "error"
            event(
                kind,
                f"run {self.run_id} {'stopped' if kind == 'stop' else 'failed'}: {report['error']['message']}",
                run_id=self.run_id,
                cause=report["cause"],
                error=report["error"],
            )
        event(
            "end",
            f"run {self.run_id} ended ({report['outcome']}): {self.stats.account()}",
            run_id=self.run_id,
            outcome=report["outcome"],
            cause=report["cause"],
            rows=report["rows"],
            requests={k: v for k, v in report["requests"].items() if k != "by_outcome"},
            seconds=report["seconds"],
            keys=report["keys"],
        )

    def pace_changed(self, change: PaceChange) -> None:
        event("pace", str(change), run_id=self.run_id, pace=change.pace, previous=change.previous, reason=change.reason)
        if self.spec.progress:
            self.pieces.bar.write(f"batchsum: {change}")

    async def _watch(self) -> None:
        """Events a scheduler follows while the run goes: a pause starting and ending, a wait for the
        budget (said in a line too), progress."""
        last_progress = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            self._look_for_pause()
            if time.monotonic() - last_progress >= PROGRESS_SECONDS:
                last_progress = time.monotonic()
                self._progress()

    def _budget_wait(self, waiting: str | None, before: tuple[str, float] | None) -> tuple[str, float] | None:
        """The run waits for its budget (``waiting``: the line), or no longer: said once each, above
        the bar (on stderr without one) and as an event."""
        if waiting is not None:
            event("budget", waiting, run_id=self.run_id, waiting=True)
            self.pieces.bar.write(f"batchsum: {waiting}; nothing starts until it answers")
            return waiting, before[1] if before is not None else time.monotonic()
        if before is not None:
            line = f"the rate budget answers again after {time.monotonic() - before[1]:.0f} s; the run goes on"
            event("budget", line, run_id=self.run_id, waiting=False)
            self.pieces.bar.write(f"batchsum: {line}")
        return None

    def _look_for_pause(self) -> None:
        """A pause or a wait for the budget starting or ending since the last look: its event."""
        state = self.stats.pacer_state()
        if state is None:
            return
        if state.budget != (self._budget[0] if self._budget else None):
            self._budget = self._budget_wait(state.budget, self._budget)
        if (state.paused_for > 0) == self._paused:
            return
        self._paused = not self._paused
        if self._paused:
            seconds, reason = round(state.paused_for, 3), state.pause_reason
            event("pause", f"paused {seconds:.1f} s: {reason}", run_id=self.run_id, seconds=seconds, reason=reason)
        else:
            event("resume", "resumed", run_id=self.run_id)

    def _progress(self) -> None:
        stats, pacer = self.stats, self.stats.pacer or self.pieces.pacer
        event(
            "progress",
            f"{stats.done}/{stats.total if stats.total is not None else '?'} rows; {stats.paid} paid requests",
            run_id=self.run_id,
            done=stats.done,
            total=stats.total,
            ok=stats.ok,
            skipped=stats.skipped,
            failed=stats.failed,
            paid=stats.paid,
            used_rate=stats.used_rate,
            rate_limited=stats.outcomes["rate_limited"],
            pace=round(pacer.pace, 3),
            in_flight=pacer.in_flight.on_wire,
            keys=[lane.describe() for lane in self.pieces.lanes] if len(self.pieces.lanes) > 1 else None,
        )
