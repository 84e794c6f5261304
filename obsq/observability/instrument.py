"""Instrumenting through the public hooks: an App (its workers' task metrics and process
spans, and the send spans and enqueue counts of every Client built with it) or one Client.
Instrumenting twice adds nothing."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from obsq.settings import DEFAULT_QUEUE

if TYPE_CHECKING:
    from obsq.app import App
    from obsq.producer.client import Client

# What each App and Client already has, so that instrumenting twice adds nothing (a second
# Worker on the same App must not count its tasks twice).
_apps: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_clients: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def instrument_app(app: App, *, metrics: bool = True, tracing: bool = True,
                   concurrency: int = 0, queues: Iterable[str] = (),
                   link: bool | None = None, worker_id: str | None = None,
                   redis_url: str | None = None) -> None:
    """Add task metrics and tracing to `app`; idempotent. Both middleware go first in the
    chain (tracing outermost, then metrics), so the process span and the timings cover the
    user's middleware too, and its logs carry the trace id. `concurrency`: the task slots
    of the calling worker, exported as obsq_worker_concurrency; `queues`: the queues it
    serves, whose known series start at 0. `link`: start each process span in a new trace
    linked to the producer's (default: OBSQ_TRACE_LINK; the copies of a published event
    always start their own trace, linked to the publisher's). `worker_id` and `redis_url`:
    the calling worker's, as `messaging.client.id` and `server.*` of its process spans."""
    done = _apps.setdefault(app, set())
    counting = _instrument_producers(app.producer_hooks, app, done, metrics=metrics,
                                     tracing=tracing)
    if counting is not None:
        app.on_refusal(counting.on_refusal)
    if metrics:
        from obsq.observability.metrics import TaskMetrics, set_concurrency, start_at_zero

        if "metrics" not in done:
            from obsq.observability.otel_metrics import messaging_meters

            m = TaskMetrics(app=app, exemplars=tracing or "tracing" in done,
                            meters=messaging_meters())
            app.middleware.insert(1 if "tracing" in done else 0, m.middleware)
            app.on_outcome(m.on_outcome)
            app.on_aggregation(m.on_aggregation)
            app.on_flow_end(m.on_flow_end)
            app.on_recovery(m.on_recovery)
            app.on_throttle(m.on_throttle)
            app.on_redis_error(m.on_redis_error)
            app.on_stuck_slots(m.on_stuck_slots)
            app.on_recycle(m.on_recycle)
            done.add("metrics")
        if concurrency:
            set_concurrency(concurrency)
        start_at_zero(app, queues)
    if tracing and "tracing" not in done:
        from obsq.observability.tracing import TaskTracing, connection_attributes

        t = TaskTracing(link=link, attributes=connection_attributes(redis_url, worker_id))
        app.middleware.insert(0, t.middleware)
        app.on_outcome(t.on_outcome)
        done.add("tracing")


def instrument_client(client: Client) -> Client:
    """Add `send {queue}` spans (with trace context in the task headers) and the
    obsq_tasks_enqueued_total and obsq_tasks_refused_total counts to `client` (a Client
    built with an instrumented App has them already); idempotent. Returns the client."""
    if client not in _clients:
        _clients[client] = set(_apps.get(client.app, ())) if client.app is not None else set()
    counting = _instrument_producers(client.hooks, client.app, _clients[client],
                                     metrics=True, tracing=True)
    if counting is not None:
        client.redis_error_hooks.append(counting.on_redis_error)
        client.on_refusal(counting.on_refusal)
    return client


def _instrument_producers(hooks: list[Any], app: App | None, done: set[str], *,
                          metrics: bool, tracing: bool) -> Any:
    """Put the producer hooks that `done` lacks first in `hooks` (the send span before the
    count); returns the enqueue counter it added, if any. Nothing of tracing is
    added with tracing off: a worker run with --no-tracing puts no trace context in the
    tasks its handlers enqueue, even where a tracer provider is set."""
    counting = None
    if metrics and "enqueued" not in done:
        from obsq.observability.enqueue_metrics import EnqueueMetrics
        from obsq.observability.metrics import start_at_zero

        if app is not None:
            start_at_zero(app, {r.queue or DEFAULT_QUEUE for r in app.routes}, worker=False)
        from obsq.observability.otel_metrics import messaging_meters

        counting = EnqueueMetrics(app, meters=messaging_meters())
        hooks.insert(0, counting.hook)
        done.add("enqueued")
    if tracing and "send" not in done:
        from obsq.observability.tracing import SendTracing

        hooks.insert(0, SendTracing())  # made for each Client it runs for: obsq_for_client
        done.add("send")
    return counting
