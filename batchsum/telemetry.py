"""OpenTelemetry metrics of a run (extra ``otel``): requests by outcome, 429s, the latency histogram,
requests in flight, the pace and rows done, recorded through the global meter provider
(``opentelemetry.metrics.get_meter``), so whatever exporter the application configured (Prometheus,
OTLP) shows a live run. Without the ``opentelemetry-api`` package nothing is recorded and nothing
fails: ``Metrics.open()`` gives ``None`` and the run goes on without it.

Instruments (all under the meter ``batchsum``):

- ``batchsum.requests`` (counter): attempts that went to the service, by ``outcome`` (``ok``,
  ``rate_limited``, or the error code: ``server_error``, ``timeout``, ...)
- ``batchsum.rate_limited`` (counter): 429s
- ``batchsum.request.duration`` (histogram, seconds): latency of answered attempts
- ``batchsum.in_flight`` (up-down counter): attempts on the wire
- ``batchsum.pace`` (observable gauge, requests/min): the pace in force
- ``batchsum.rows`` (counter): rows done, by ``status`` (ok, skipped, failed)
"""

from __future__ import annotations

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


class Metrics:
    """The instruments of one run; each run's attributes carry its ``run_id``."""

    def __init__(self, meter: Any, run_id: str, pace: Callable[[], float]) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        self._attributes = {"batchsum.run": run_id}
        self.requests = meter.create_counter("batchsum.requests", unit="{request}", description="attempts sent")
        self.rate_limited = meter.create_counter("batchsum.rate_limited", unit="{request}", description="429s")
        self.latency = meter.create_histogram(
            "batchsum.request.duration", unit="s", description="latency of answered attempts"
        )
        self.in_flight = meter.create_up_down_counter(
            "batchsum.in_flight", unit="{request}", description="attempts on the wire"
        )
        self.rows = meter.create_counter("batchsum.rows", unit="{row}", description="rows done, by status")
        attributes = self._attributes

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(pace(), attributes)

        self.pace = meter.create_observable_gauge(
            "batchsum.pace", callbacks=[observe], unit="{request}/min", description="the pace in force"
        )

    @classmethod
    def open(cls, run_id: str, pace: Callable[[], float], version: str | None = None) -> Metrics | None:
        """The run's instruments on the global meter provider; None without the ``otel`` extra."""
        try:
            from opentelemetry import metrics
        except ImportError:
            return None
        return cls(metrics.get_meter(METER_NAME, version or ""), run_id, pace)

    def attempt_started(self) -> None:
        self.in_flight.add(1, self._attributes)

    def attempt_ended(self, outcome: str, latency: float | None) -> None:
        self.in_flight.add(-1, self._attributes)
        self.requests.add(1, {**self._attributes, "outcome": outcome})
        if outcome == "rate_limited":
            self.rate_limited.add(1, self._attributes)
        if latency is not None:
            self.latency.record(latency, self._attributes)

    def row_done(self, status: str) -> None:
        self.rows.add(1, {**self._attributes, "status": status})
