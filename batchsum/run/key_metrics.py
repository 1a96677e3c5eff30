"""The figures ``batchsum top`` shows, as metrics for Grafana (``KeyMetrics``): OpenTelemetry observable
gauges (the API batchsum records its runs through), read by a Prometheus exporter that ``top
--metrics-port`` serves (extra ``prometheus``). Labels: the key's short hash (``batchsum_key``), the run
id (``batchsum_run``) and a quota's name: never the key, an output or a location.

Gauges, each the latest view's (Prometheus' names):

- per key: ``batchsum_key_limit_per_min``, ``batchsum_key_starts_10s``, ``batchsum_key_starts_1m``,
  ``batchsum_key_rate_limited_1m``, ``batchsum_key_paused_seconds`` (the pause left), ``batchsum_key_runs``,
  ``batchsum_key_quota_left`` (``batchsum_quota``: its name);
- per run: ``batchsum_run_limit_per_min``, ``batchsum_run_share``, ``batchsum_run_sent``,
  ``batchsum_run_reused``, ``batchsum_run_rate_limited``, ``batchsum_run_starts_1m``, ``batchsum_run_processes``,
  ``batchsum_run_rows_left`` and ``batchsum_run_eta_seconds`` (only where the run knows its size);
  a gateway's ``batchsum_run_queue``, ``batchsum_run_wait_p50_seconds``, ``batchsum_run_wait_p95_seconds``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..pacing.look.view import UNKNOWN, BudgetView, KeyView, RunView
from ..service.errors import ConfigurationError

__all__ = ["KeyMetrics", "KEY_GAUGES", "RUN_GAUGES", "EXTRA"]

EXTRA = "prometheus"

# name, unit, description, the figure (None: no data point)
KEY_GAUGES: list[tuple[str, str, str, Callable[[KeyView], float | None]]] = [
    ("batchsum.key.limit", "{request}/min", "the limit in force (the lowest, when runs disagree)", lambda k: k.limit),
    ("batchsum.key.starts_10s", "{request}", "starts on the key in the last 10 s", lambda k: k.starts_10s),
    ("batchsum.key.starts_1m", "{request}", "starts on the key in the last 60 s", lambda k: k.rate_1m),
    ("batchsum.key.rate_limited_1m", "{request}", "429s to the starts of the last 60 s", lambda k: k.rate_limited_1m),
    (
        "batchsum.key.paused",
        "s",
        "seconds of the key's shared pause left (0: none)",
        lambda k: max(0.0, k.paused_until - k.now) if k.paused_until is not None else 0.0,
    ),
    ("batchsum.key.runs", "{run}", "runs on the key", lambda k: len(k.runs)),
]
RUN_GAUGES: list[tuple[str, str, str, Callable[[RunView], float | None]]] = [
    ("batchsum.run.limit", "{request}/min", "the limit the run paces by", lambda r: r.rpm),
    ("batchsum.run.share", "1", "the share of the key the run may use", lambda r: r.share),
    ("batchsum.run.sent", "{request}", "attempts the run started on the key", lambda r: r.sent),
    ("batchsum.run.reused", "{row}", "rows answered without a request", lambda r: r.reused),
    ("batchsum.run.rate_limited", "{request}", "429s the run met on the key", lambda r: r.rate_limited),
    ("batchsum.run.starts_1m", "{request}", "the run's starts in the last 60 s", lambda r: r.rate_1m),
    ("batchsum.run.processes", "{process}", "processes of the run (a job's workers)", lambda r: r.processes),
    (
        "batchsum.run.rows_left",
        "{row}",
        "rows the run has left",
        lambda r: None if r.rows_left == UNKNOWN or r.rows_left is None else float(r.rows_left),
    ),
    ("batchsum.run.eta", "s", "seconds the run has left at its rate", lambda r: r.eta_s),
    ("batchsum.run.queue", "{request}", "a gateway's requests waiting for their turn", lambda r: r.queue),
    ("batchsum.run.wait_p50", "s", "a gateway's median wait for a turn, last 60 s", lambda r: r.wait_p50_s),
    ("batchsum.run.wait_p95", "s", "a gateway's 95th percentile wait for a turn, last 60 s", lambda r: r.wait_p95_s),
]


class KeyMetrics:
    """The gauges of the latest view shown (``show``), on a meter provider of their own whose
    Prometheus reader ``serve`` exposes over HTTP."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import CallbackOptions, Observation

        self._view: BudgetView | None = None
        self._lock = threading.Lock()

        def keys() -> list[KeyView]:
            with self._lock:
                return list(self._view.keys) if self._view is not None else []

        def per_key(figure: Callable[[KeyView], float | None]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def observe(options: CallbackOptions) -> Iterable[Observation]:
                for key in keys():
                    value = figure(key)
                    if value is not None:
                        yield Observation(float(value), {"batchsum.key": key.key})

            return observe

        def per_run(figure: Callable[[RunView], float | None]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def observe(options: CallbackOptions) -> Iterable[Observation]:
                for key in keys():
                    for run in key.runs:
                        value = figure(run)
                        if value is not None:
                            yield Observation(float(value), {"batchsum.key": key.key, "batchsum.run": run.run_id})

            return observe

        def quotas(options: CallbackOptions) -> Iterable[Observation]:
            for key in keys():
                for quota in key.quotas:
                    if quota.left is not None:
                        yield Observation(float(quota.left), {"batchsum.key": key.key, "batchsum.quota": quota.name})

        for name, unit, description, figure in KEY_GAUGES:
            meter.create_observable_gauge(name, callbacks=[per_key(figure)], unit=unit, description=description)
        for name, unit, description, run_figure in RUN_GAUGES:
            meter.create_observable_gauge(name, callbacks=[per_run(run_figure)], unit=unit, description=description)
        meter.create_observable_gauge(
            "batchsum.key.quota_left", callbacks=[quotas], unit="{request}", description="requests left in a quota"
        )
        self._close: Callable[[], None] = lambda: None

    def show(self, view: BudgetView) -> None:
        """The view the gauges report from now on."""
        with self._lock:
            self._view = view

    @classmethod
    def serve(cls, port: int, address: str = "127.0.0.1") -> KeyMetrics:
        """The gauges, served for Prometheus at ``http://ADDRESS:PORT/metrics`` (a registry of their
        own: only these). ``ConfigurationError`` without the extra, or when the port cannot be taken."""
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigurationError(
                f"--metrics-port needs the Prometheus exporter: pip install 'batchsum[{EXTRA}]'"
            ) from None
        from ..service.version import __version__

        registry = CollectorRegistry()
        provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
        metrics = cls(provider.get_meter("batchsum.top", __version__))
        try:
            server, thread = start_http_server(port, addr=address, registry=registry)
        except OSError as exc:
            provider.shutdown()
            raise ConfigurationError(
                f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}; choose another --metrics-port"
            ) from None

        def close() -> None:
            server.shutdown()
            server.server_close()
            thread.join(5)
            provider.shutdown()

        metrics._close = close
        return metrics

    def close(self) -> None:
        self._close()
