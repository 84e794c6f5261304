"""The producer's metrics: obsq_tasks_enqueued_total and obsq_tasks_refused_total, counted
by a Client's producer hook and refusal hook.

Their `queue` label is bounded, for the producers that make queue names per tenant: the
queues of instrumented Apps' routes always, then the first OBSQ_METRICS_QUEUES (default
METRICS_QUEUE_LIMIT) other names seen in this process, the rest `other`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from obsq.app import App, CallNextProducer
from obsq.errors import BrokerError, ConfigurationError, TaskTooLarge
from obsq.observability.metrics import LABEL_CACHE_LIMIT, OTHER, Metrics, get_metrics
from obsq.producer.enqueue import sync_safe
from obsq.settings import DEFAULT_QUEUE, METRICS_QUEUE_LIMIT
from obsq.task import Job, TaskInfo, TaskMessage

if TYPE_CHECKING:
    from obsq.observability.otel_metrics import MessagingMeters

QUEUE_LIMIT_ENV = "OBSQ_METRICS_QUEUES"


def queue_limit() -> int:
    """OBSQ_METRICS_QUEUES: how many queue names beyond the App's a producer's metrics name."""
    raw = os.environ.get(QUEUE_LIMIT_ENV, "").strip()
    if not raw:
        return METRICS_QUEUE_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ConfigurationError(f"{QUEUE_LIMIT_ENV}={raw!r}: give a number of queues (0 or "
                                 "more)")
    return limit


class QueueLabels:
    """The `queue` label of the producer metrics: the known queues, then the first `limit`
    other names seen, the rest `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.known: set[str] = set()
        self._others: set[str] = set()
        self._lock = threading.Lock()  # a SyncClient's hooks run in its callers' threads

    def __call__(self, queue: str) -> str:
        if queue in self.known or queue in self._others:
            return queue
        with self._lock:
            if len(self._others) < self.limit:
                self._others.add(queue)
                return queue
        return OTHER


_labels: QueueLabels | None = None


def _queue_labels() -> QueueLabels:
    """The process's bound (one for all its Clients), made on first use."""
    global _labels
    if _labels is None:
        _labels = QueueLabels(queue_limit())
    return _labels


class EnqueueMetrics:
    """The producer hook of a Client: counts the tasks Redis accepted, and those refused by
    reason (the Client's checks tell `on_refusal`; the rest pass through the hook)."""

    def __init__(self, app: App | None, m: Metrics | None = None,
                 meters: MessagingMeters | None = None) -> None:
        """`meters`: the OpenTelemetry instruments the same counts also go to (with each
        call's duration), when metrics are pushed over OTLP."""
        self.m = m or get_metrics()
        self.meters = meters
        self.app = app
        if app is not None:
            _queue_labels().known.update(r.queue or DEFAULT_QUEUE for r in app.routes)
        self._children: dict[tuple[str, str], Any] = {}

    def _task_label(self, task_type: str) -> str:
        route = self.app.route(task_type) if self.app is not None else None
        return route.pattern if route else OTHER

    def _child(self, queue: str, task_type: str) -> Any:
        key = (queue, task_type)
        child = self._children.get(key)
        if child is None:
            child = self.m.enqueued.labels(_queue_labels()(queue),
                                           self._task_label(task_type))
            if len(self._children) < LABEL_CACHE_LIMIT:
                self._children[key] = child
        return child

    def _refused(self, queue: str, task_type: str, reason: str) -> None:
        self.m.refused.labels(_queue_labels()(queue), self._task_label(task_type),
                              reason).inc()

    @sync_safe  # awaits only call_next: a SyncClient runs it in its caller's thread
    async def hook(self, messages: list[TaskMessage],
                   call_next: CallNextProducer) -> list[TaskInfo]:
        meters = self.meters
        start = time.perf_counter() if meters is not None else 0.0
        try:
            infos = await call_next(messages)
        except BaseException as exc:
            if isinstance(exc, BrokerError):
                reason = ("out_of_memory" if exc.out_of_memory else "permission_denied"
                          if exc.permission_denied else "redis_error")
                for m in messages:
                    self._refused(m.queue, m.type, reason)
            if meters is not None:
                meters.sent_messages(messages, time.perf_counter() - start, exc)
            raise
        if meters is not None:
            meters.sent_messages(messages, time.perf_counter() - start, None)
        for info in infos:
            if info.duplicate:
                self._refused(info.queue, info.type, "duplicate")
            else:
                self._child(info.queue, info.type).inc()
        return infos

    def on_refusal(self, job: Job, error: Exception) -> None:
        route = self.app.route(job.type) if self.app is not None else None
        queue = job.queue or (route.queue if route else None) or DEFAULT_QUEUE
        self._refused(queue if isinstance(queue, str) else OTHER, job.type,
                      "too_large" if isinstance(error, TaskTooLarge) else "invalid")

    def on_redis_error(self, operation: str, exc: BaseException) -> None:
        self.m.redis_errors.labels(operation).inc()
