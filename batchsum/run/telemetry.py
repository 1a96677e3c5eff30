"""OpenTelemetry metrics of a run (extra ``otel``): requests by outcome, 429s, the latency histogram,
requests in flight, the pace and rows done, recorded through the global meter provider
(``opentelemetry.metrics.get_meter``), so whatever exporter the application configured (Prometheus,
OTLP) shows a live run. Without the ``opentelemetry-api`` package nothing is recorded and nothing
fails: ``Metrics.open()`` gives ``None`` and the run goes on without it.

Instruments (all under the meter ``batchsum``):

- ``batchsum.requests`` (counter): attempts that went to the service, by ``outcome`` (``ok``,
  ``rate_limited``, or the error code: ``server_error``, ``timeout``, ...)
- ``batchsum.rate_limited`` (counter): 429s
- ``batchsum.paid`` (counter): attempts the service billed, or may have (a lost answer), as the run
  report's ``requests.paid`` counts them (``engine.tally.charge``): not a 429, a 401, a 422, a 5xx
- ``batchsum.request.duration`` (histogram, seconds): latency of answered attempts
- ``batchsum.in_flight`` (up-down counter): attempts on the wire
- ``batchsum.pace`` (observable gauge, requests/min): the pace in force
- ``batchsum.rows`` (counter): rows done, by ``status`` (ok, skipped, failed)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Metrics", "available"]

METER_NAME = "batchsum"


def available() -> bool:
    """Is the OpenTelemetry API importable (the ``otel`` extra)?"""
    try:
        import opentelemetry.metrics  # noqa: F401
    except ImportError:
        return False
    return True


class _Instruments:
    """The instruments, created once per process (an instrument's name is registered once per meter:
    a second one of the same name would be the first, with the first run's callback)."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        self.runs: weakref.WeakSet[Metrics] = weakref.WeakSet()  # the runs the pace gauge reports
        self.requests = meter.create_counter("batchsum.requests", unit="{request}", description="attempts sent")
        self.rate_limited = meter.create_counter("batchsum.rate_limited", unit="{request}", description="429s")
        self.paid = meter.create_counter(
            "batchsum.paid", unit="{request}", description="attempts billed, or maybe billed (a lost answer)"
        )
        self.latency = meter.create_histogram(
            "batchsum.request.duration", unit="s", description="latency of answered attempts"
        )
        self.in_flight = meter.create_up_down_counter(
            "batchsum.in_flight", unit="{request}", description="attempts on the wire"
        )
        self.rows = meter.create_counter("batchsum.rows", unit="{row}", description="rows done, by status")
        runs = self.runs

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for run in list(runs):
                yield Observation(run.pace(), run.attributes)

        self.pace = meter.create_observable_gauge(
            "batchsum.pace", callbacks=[observe], unit="{request}/min", description="the pace in force"
        )


_instruments: _Instruments | None = None
_lock = threading.Lock()


class Metrics:
    """What one run records; its data points carry its ``batchsum.run`` id."""

    def __init__(self, instruments: _Instruments, run_id: str, pace: Callable[[], float]) -> None:
        self.attributes = {"batchsum.run": run_id}
        self.pace = pace
        self._instruments = instruments
        instruments.runs.add(self)

    @classmethod
    def open(cls, run_id: str, pace: Callable[[], float], version: str | None = None) -> Metrics | None:
        """The run's metrics on the global meter provider; None without the ``otel`` extra."""
        global _instruments
        try:
            from opentelemetry import metrics
        except ImportError:
            return None
        with _lock:
            if _instruments is None:
                _instruments = _Instruments(metrics.get_meter(METER_NAME, version or ""))
            return cls(_instruments, run_id, pace)

    def close(self) -> None:
        """The run has ended: the pace gauge no longer reports it."""
        self._instruments.runs.discard(self)

    def attempt_started(self) -> None:
        self._instruments.in_flight.add(1, self.attributes)

    def attempt_ended(self, outcome: str, latency: float | None, paid: bool) -> None:
        instruments = self._instruments
        instruments.in_flight.add(-1, self.attributes)
        instruments.requests.add(1, {**self.attributes, "outcome": outcome})
        if outcome == "rate_limited":
            instruments.rate_limited.add(1, self.attributes)
        if paid:
            instruments.paid.add(1, self.attributes)
        if latency is not None:
            instruments.latency.record(latency, self.attributes)

    def row_done(self, status: str, count: int = 1) -> None:
        self._instruments.rows.add(count, {**self.attributes, "status": status})
