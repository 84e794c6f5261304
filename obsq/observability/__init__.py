"""Metrics, tracing, logs and the health endpoint, built only on the public hooks: the App's
middleware, outcome/recovery/Redis-error hooks and producer hooks, and the Client's.

- `instrument_app(app)`: task metrics and `process {queue}` spans for its workers, and
  `send {queue}` spans and enqueue counts for every Client built with it;
- `instrument_client(client)`: the same producer side for one Client (one without an App);
- `run_worker(worker, http_port=...)`, `run_scheduler(...)`, `run_exporter(...)`: a
  process with the instrumentation and its /metrics, /healthz, /readyz and / endpoint;
- `configure_logging(fmt, level)`, `setup_tracing()`, `shutdown_tracing()`;
- `setup_otel_metrics()`, `shutdown_otel_metrics()`: the messaging metrics pushed over
  OTLP when OTEL_METRICS_EXPORTER asks (Prometheus's /metrics serves them whatever).

Modules: metrics, enqueue_metrics, otel_metrics, collector (queue gauges read from Redis),
tracing, logs, probes, http, processes. prometheus-client and the OpenTelemetry SDK are
imported when first needed, not by `import obsq`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from obsq.observability.instrument import instrument_app, instrument_client

if TYPE_CHECKING:
    from obsq.engine.scheduler import Scheduler
    from obsq.engine.worker import Worker


def configure_logging(fmt: str = "text", level: str | int = "INFO", stream: Any = None) -> Any:
    from obsq.observability.logs import configure_logging

    return configure_logging(fmt, level, stream)


def setup_tracing(service_name: str = "obsq-worker") -> bool:
    from obsq.observability.tracing import setup_tracing

    return setup_tracing(service_name)


def shutdown_tracing() -> None:
    from obsq.observability.tracing import shutdown_tracing

    shutdown_tracing()


def setup_otel_metrics(service_name: str = "obsq-worker") -> bool:
    from obsq.observability.otel_metrics import setup_otel_metrics

    return setup_otel_metrics(service_name)


def shutdown_otel_metrics() -> None:
    from obsq.observability.otel_metrics import shutdown_otel_metrics

    shutdown_otel_metrics()


async def run_worker(worker: Worker, **options: Any) -> None:
    """See obsq.observability.processes.run_worker."""
    from obsq.observability.processes import run_worker

    await run_worker(worker, **options)


async def run_scheduler(scheduler: Scheduler, **options: Any) -> None:
    """See obsq.observability.processes.run_scheduler."""
    from obsq.observability.processes import run_scheduler

    await run_scheduler(scheduler, **options)


async def run_exporter(redis_url: str, namespace: str, port: int, **options: Any) -> None:
    """See obsq.observability.processes.run_exporter."""
    from obsq.observability.processes import run_exporter

    await run_exporter(redis_url, namespace, port, **options)


__all__ = ["configure_logging", "instrument_app", "instrument_client", "run_exporter",
           "run_scheduler", "run_worker", "setup_otel_metrics", "setup_tracing",
           "shutdown_otel_metrics", "shutdown_tracing"]
