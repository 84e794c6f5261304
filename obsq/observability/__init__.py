"""Metrics, tracing, logs and the health endpoint, built only on the public hooks: the App's
middleware and outcome/recovery/Redis-error hooks, and the Client's producer hooks.

- `instrument_app(app)`: task metrics and `process {queue}` spans (the Worker calls it);
- `instrument_client(client)`: `send {queue}` spans and the enqueued count (the Client
  calls it unless `instrument=False`);
- `serve_http(worker, host, port)`: /metrics, /healthz, /readyz and /;
- `configure_logging(fmt, level)`, `setup_tracing()`, `shutdown_tracing()`;
- `run_exporter(redis_url, namespace, port)`: the `obsq exporter` command.

Modules: metrics, collector (queue gauges read from Redis), tracing, http, logs, exporter.
prometheus-client and the OpenTelemetry SDK are imported when first needed, not by
`import obsq`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from obsq.task import DEFAULT_QUEUE

if TYPE_CHECKING:
    from obsq.app import App
    from obsq.client import Client

# What each App and Client already has, so that instrumenting twice adds nothing (a second
# Worker on the same App must not count its tasks twice).
_apps: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_clients: weakref.WeakSet[Any] = weakref.WeakSet()


def instrument_app(app: App, *, metrics: bool = True, tracing: bool = True,
                   concurrency: int = 0, queues: Iterable[str] = (),
                   link: bool | None = None) -> None:
    """Add task metrics and tracing to `app`; idempotent. Both middleware go first in the
    chain (tracing outermost, then metrics), so the process span and the timings cover the
    user's middleware too, and its logs carry the trace id. `concurrency`: the task slots
    of the calling worker, exported as obsq_worker_concurrency; `queues`: the queues it
    serves, whose known series start at 0. `link`: start each process span in a new trace
    linked to the producer's (default: OBSQ_TRACE_LINK)."""
    done = _apps.setdefault(app, set())
    if metrics:
        from obsq.observability.metrics import TaskMetrics, set_concurrency, start_at_zero

        if "metrics" not in done:
            m = TaskMetrics()
            app.middleware.insert(1 if "tracing" in done else 0, m.middleware)
            app.on_outcome(m.on_outcome)
            app.on_recovery(m.on_recovery)
            app.on_redis_error(m.on_redis_error)
            done.add("metrics")
        if concurrency:
            set_concurrency(concurrency)
        start_at_zero(app, queues)
    if tracing and "tracing" not in done:
        from obsq.observability.tracing import TaskTracing

        t = TaskTracing(link=link)
        app.middleware.insert(0, t.middleware)
        app.on_outcome(t.on_outcome)
        done.add("tracing")


def instrument_client(client: Client) -> None:
    """Add `send {queue}` spans (with trace context in the task headers) and the
    obsq_tasks_enqueued_total count to `client`; idempotent."""
    if client in _clients:
        return
    from obsq.observability.metrics import EnqueueMetrics, start_at_zero
    from obsq.observability.tracing import SendTracing

    if client.app is not None:
        start_at_zero(client.app, {r.queue or DEFAULT_QUEUE for r in client.app.routes},
                      worker=False)
    counting = EnqueueMetrics(client.app)
    client.use(SendTracing().hook)
    client.use(counting.hook)
    client.broker.on_error.append(counting.on_redis_error)
    _clients.add(client)


def serve_http(worker: Any, host: str, port: int) -> Any:
    from obsq.observability.http import serve_http

    return serve_http(worker, host, port)


def configure_logging(fmt: str = "text", level: str | int = "INFO", stream: Any = None) -> Any:
    from obsq.observability.logs import configure_logging

    return configure_logging(fmt, level, stream)


def setup_tracing(service_name: str = "obsq-worker") -> bool:
    from obsq.observability.tracing import setup_tracing

    return setup_tracing(service_name)


def shutdown_tracing() -> None:
    from obsq.observability.tracing import shutdown_tracing

    shutdown_tracing()


async def run_exporter(redis_url: str, namespace: str, port: int, **options: Any) -> None:
    from obsq.observability.exporter import run_exporter

    await run_exporter(redis_url, namespace, port, **options)


__all__ = ["configure_logging", "instrument_app", "instrument_client", "run_exporter",
           "serve_http", "setup_tracing", "shutdown_tracing"]
