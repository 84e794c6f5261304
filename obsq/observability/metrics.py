"""Prometheus metrics of tasks, built on the App's middleware and hooks (the Client's
producer hook is in enqueue_metrics).

The metric objects live in prometheus-client's default registry, created once per
process (so a user's own metrics appear beside them), and work in its multiprocess mode
(`PROMETHEUS_MULTIPROC_DIR`): gauges say how the processes' values combine. The hot path
resolves label children once per (queue, task) and keeps them: `.labels()` costs more
than the observation itself.

Task labels are bounded: the registered route pattern that matched, else `other` (and a
producer's queue labels, see enqueue_metrics). Ids, payloads and error texts never become
labels. Counters and histograms export no `_created` samples (prometheus-client's switch):
they were a quarter of the exposition, and Prometheus does not read them from the text
format.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.multiprocess import MultiProcessCollector

from obsq._version import __version__
from obsq.app import AGGREGATION_OUTCOMES, OUTCOMES, RECOVERY_REASONS, THROTTLE_REASONS, App
from obsq.broker.calls import OPERATIONS
from obsq.engine.recycling import RECYCLE_REASONS
from obsq.errors import UnknownTaskType
from obsq.flow import FLOW_OUTCOMES
from obsq.settings import DEFAULT_QUEUE
from obsq.task import Task

if TYPE_CHECKING:
    from obsq.engine.worker import Worker
    from obsq.observability.otel_metrics import MessagingMeters

# From 5 ms to an hour: handlers and queueing delays of a task queue span seconds to
# minutes, unlike the sub-second buckets of an HTTP server, and the top bucket lies past the
# default timeout (DEFAULT_TIMEOUT, 30 minutes), so long handlers are not lumped into +Inf.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
           120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
OTHER = "other"
RAN_KEY = "obsq.ran"  # task.context: the attempt entered the handler chain, not yet counted
UNKNOWN_TYPE_OUTCOMES = ("handed_on", "dead")
LABEL_CACHE_LIMIT = 10_000  # task types behind "*" are unbounded; their labels are not
# Why an enqueue wrote nothing (obsq_tasks_refused_total): its id or unique lock is taken,
# its payload or headers are over their limit, another option is wrong, Redis is above the
# producers' share of maxmemory, the Redis user may not write, or the call failed otherwise.
REFUSAL_REASONS = ("duplicate", "too_large", "invalid", "out_of_memory", "permission_denied",
                   "redis_error")


def multiprocess_dir() -> str | None:
    """The directory of prometheus-client's multiprocess mode, when it is on."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def clear_multiprocess_dir(path: str | None = None) -> None:
    """Remove the value files a previous run left behind. Only the process that serves the
    directory's metrics may call this, before any metric is created: a restarted container
    gets the pids of its previous run, and would otherwise inherit their counts."""
    path = path or multiprocess_dir()
    if path:
        os.makedirs(path, exist_ok=True)
        for name in glob.glob(os.path.join(path, "*.db")):
            os.remove(name)


def remove_multiprocess_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class Metrics:
    """The process-wide metric objects (one set per process, whatever the number of Apps)."""

    def __init__(self) -> None:
        disable_created_metrics()
        self.multiprocess = multiprocess_dir() is not None
        self.enqueued = Counter("obsq_tasks_enqueued", "Tasks enqueued by this process",
                                ["queue", "task"])
        self.refused = Counter(
            "obsq_tasks_refused", "Tasks this process asked to enqueue and that were not "
            "written, by reason: " + ", ".join(REFUSAL_REASONS), ["queue", "task", "reason"])
        self.processed = Counter(
            "obsq_tasks_processed", "Handler runs finished, by outcome: success, retry "
            "(failed, scheduled again), dead (failed for good), cancelled (stopped because "
            "its task was cancelled), expired (not started by its expiry: it never ran, or "
            "its retry would have started after it), requeued (handed back unfinished at "
            "shutdown), "
            "lease_lost (finished after its lease was taken over; its result refused), "
            "unrecorded (finished, but Redis stayed away until the worker stopped)",
            ["queue", "task", "outcome"])
        self.duration = Histogram("obsq_task_duration_seconds", "Handler run time",
                                  ["queue", "task"], buckets=BUCKETS)
        self.wait = Histogram(
            "obsq_task_wait_seconds", "From the moment a task was due to its start "
            "(queueing latency; deliberate delays excluded)", ["queue", "task"],
            buckets=BUCKETS)
        self.in_progress = Gauge("obsq_tasks_in_progress", "Tasks running now in this process",
                                 ["queue", "task"], multiprocess_mode="livesum")
        self.concurrency = Gauge("obsq_worker_concurrency", "Task slots of this process",
                                 multiprocess_mode="livesum")
        self.stuck_slots = Gauge(
            "obsq_worker_stuck_slots", "Plain handlers of this process that overran their "
            "timeout and still run in their thread, holding their slot until they return",
            multiprocess_mode="livesum")
        self.recycled = Counter(
            "obsq_worker_children_recycled", "Processes running handlers (the process "
            "pool's children, or the worker processes of --processes) replaced past their "
            "limits, by reason: tasks (--max-tasks-per-child) or memory "
            "(--max-memory-per-child)", ["reason"])
        self.recoveries = Counter(
            "obsq_lease_recoveries", "Tasks taken back from a worker: expired (lease ran "
            "out) or worker_lost (its worker stopped heartbeating)", ["queue", "reason"])
        self.unknown_types = Counter(
            "obsq_tasks_unknown_type", "Tasks of a type this process has no handler for: "
            "handed_on (to a worker that has one, no retry spent) or dead (handed on for "
            "longer than unknown_type_max_age)", ["queue", "outcome"])
        self.redis_errors = Counter("obsq_redis_errors", "Failed Redis calls", ["operation"])
        self.throttled = Counter(
            "obsq_tasks_throttled", "Starts held back: concurrency (a route's limit), rate "
            "(a route's rate limit) or ordering (a task ahead on its ordering key)",
            ["queue", "task", "reason"])
        self.scheduler_fires = Counter("obsq_scheduler_fires",
                                       "Schedule fires enqueued by this process", ["entry"])
        self.scheduler_missed = Counter(
            "obsq_scheduler_missed", "Schedule fires missed while no scheduler ran and not "
            "enqueued, as the entry's missed policy says", ["entry"])
        self.aggregations = Counter(
            "obsq_aggregations", "Runs of an aggregator (app.aggregate) over a batch of "
            "grouped tasks: success (its task enqueued) or failed (the batch is tried again)",
            ["queue", "task", "outcome"])
        self.flows_ended = Counter(
            "obsq_flows_ended", "Flows (chains, chords) a worker of this process ended when "
            "it recorded a step's end: completed, failed (a step ended dead or cancelled), "
            "or cancelled (by a Client: counted with the first of its steps' ends)",
            ["outcome"])
        self.deliveries = Counter(
            "obsq_event_deliveries", "Attempts of the copies of published events, by event, "
            "subscriber and outcome (those of obsq_tasks_processed_total)",
            ["event", "subscriber", "outcome"])
        self.loop_lag = Gauge(
            "obsq_worker_event_loop_lag_seconds", "How long the worker's event loop has "
            "been blocked now (a handler calling blocking code in an async def); 0 while it "
            "runs", multiprocess_mode="livemax")
        self.fetch_stalled = Gauge(
            "obsq_worker_fetch_stalled_seconds", "How long the worker's fetch loop has gone "
            "without coming round past the longest a round lasts (its blocking wait, the call "
            "deadline and a retry's pause): it takes no task meanwhile; 0 while it comes round",
            multiprocess_mode="livemax")
        self.data_lost = Counter(
            "obsq_redis_data_lost", "Times a worker found that Redis had lost its data "
            "(restarted without persistence, or flushed)")
        self.build_info = Gauge("obsq_build_info", "obsq version; always 1", ["version"],
                                multiprocess_mode="max")
        self.build_info.labels(__version__).set(1)


_metrics: Metrics | None = None


def get_metrics() -> Metrics:
    """The metric objects, created on first use (not at import, so that the CLI can clear
    a multiprocess directory first)."""
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
    return _metrics


def _exemplar() -> dict[str, str] | None:
    """The current trace id, when a sampled span is current."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.trace_flags & 1:  # sampled (an invalid context has flags 0)
        return {"trace_id": format(ctx.trace_id, "032x")}
    return None


class TaskMetrics:
    """The middleware and hooks that one App gets."""

    def __init__(self, m: Metrics | None = None, app: App | None = None, *,
                 exemplars: bool = True, meters: MessagingMeters | None = None) -> None:
        """`exemplars`: trace ids on the histograms, looked up per task (off when the App's
        tasks are not traced: there is no trace to point to). `meters`: the OpenTelemetry
        instruments the same timings also go to, when metrics are pushed over OTLP."""
        self.m = m or get_metrics()
        self.meters = meters
        self.subscriptions = app.subscriptions if app is not None else {}
        self._running: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}
        self._recoveries: dict[tuple[str, str], Any] = {}
        self._errors: dict[str, Any] = {}
        self._exemplars = exemplars and not self.m.multiprocess  # multiprocess drops them

    def _children(self, key: tuple[str, str]) -> tuple[Any, Any, Any]:
        m = self.m
        children = (m.duration.labels(*key), m.wait.labels(*key), m.in_progress.labels(*key))
        self._running[key] = children
        return children

    async def middleware(self, task: Task, call_next: Callable[[Task], Any]) -> Any:
        key = (task.queue, task.route)
        duration, wait, in_progress = self._running.get(key) or self._children(key)
        exemplar = _exemplar() if self._exemplars else None
        task.context[RAN_KEY] = True
        wait.observe(task.wait_seconds, exemplar)
        in_progress.inc()
        meters = self.meters
        if meters is not None:
            meters.started(task.queue)
        failure: BaseException | None = None
        start = time.perf_counter()
        try:
            return await call_next(task)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            took = time.perf_counter() - start
            duration.observe(took, exemplar)
            in_progress.dec()
            if meters is not None:
                meters.processed(task.queue, took, failure)

    def on_outcome(self, task: Task, outcome: str, error: BaseException | None) -> None:
        """Count each handler run once: not a prefetched task handed back before it ran,
        nor an attempt reported again after it was counted (e.g. requeued at shutdown)."""
        if isinstance(error, UnknownTaskType):  # no handler ran: its own count
            self.m.unknown_types.labels(task.queue, outcome).inc()
            return
        if task.context.get(RAN_KEY) is not True and outcome != "expired":
            return  # (an expired task is counted though it never ran: it never will)
        task.context[RAN_KEY] = False
        key = (task.queue, task.route, outcome)
        child = self._outcomes.get(key)
        if child is None:
            child = self._outcomes[key] = self.m.processed.labels(*key)
        child.inc()
        subscription = self.subscriptions.get(task.route)
        if subscription is not None:  # a copy of an event: its subscriber's delivery
            self.m.deliveries.labels(subscription.event, subscription.name, outcome).inc()

    def on_aggregation(self, queue: str, pattern: str, outcome: str) -> None:
        self.m.aggregations.labels(queue, pattern, outcome).inc()

    def on_flow_end(self, state: str) -> None:
        self.m.flows_ended.labels(state).inc()

    def on_recovery(self, queue: str, reason: str, count: int) -> None:
        key = (queue, reason)
        child = self._recoveries.get(key)
        if child is None:
            child = self._recoveries[key] = self.m.recoveries.labels(*key)
        child.inc(count)

    def on_throttle(self, queue: str, task: str, reason: str) -> None:
        self.m.throttled.labels(queue, task, reason).inc()

    def on_recycle(self, reason: str) -> None:
        self.m.recycled.labels(reason).inc()

    def on_stuck_slots(self, count: int) -> None:
        self.m.stuck_slots.set(count)

    def on_redis_error(self, operation: str, exc: BaseException) -> None:
        child = self._errors.get(operation)
        if child is None:
            child = self._errors[operation] = self.m.redis_errors.labels(operation)
        child.inc()


class SchedulerMetrics:
    """The hooks of a Scheduler: fires and missed fires per entry (the entry's name, a
    bounded label: the App's entries and those added at run time). Each known entry's
    series start at 0; those of a removed entry go with it, so that names added and removed
    at run time do not pile up."""

    def __init__(self, m: Metrics | None = None) -> None:
        self.m = m or get_metrics()
        self._known: set[str] = set()

    def on_entries(self, names: list[str]) -> None:
        for name in names:
            self.m.scheduler_fires.labels(name)
            self.m.scheduler_missed.labels(name)
        if not self.m.multiprocess:  # its value files cannot forget a series
            for name in self._known - set(names):
                self.m.scheduler_fires.remove(name)
                self.m.scheduler_missed.remove(name)
        self._known = set(names)

    def on_fire(self, entry: str, outcome: str, count: int) -> None:
        counter = self.m.scheduler_fires if outcome == "fired" else self.m.scheduler_missed
        counter.labels(entry).inc(count)


def start_at_zero(app: App, queues: Iterable[str], *, worker: bool = True) -> None:
    """Create at 0 every series whose label values are known now, so that a dashboard shows
    0 rather than "no data" and `increase()` counts the first event: the Redis operations,
    and for the given queues the recovery reasons and (a worker) the outcomes, durations,
    waits and throttled starts of each route that enqueues there by default, its
    aggregators' runs and its subscribers' deliveries, or (a producer) its enqueues and
    refusals."""
    m = get_metrics()
    for operation in OPERATIONS:
        m.redis_errors.labels(operation)
    served = set(queues)
    routed = [(route.queue or DEFAULT_QUEUE, route.pattern) for route in app.routes]
    for queue, task in routed:
        if queue not in served:
            continue
        if not worker:
            m.enqueued.labels(queue, task)
            for reason in REFUSAL_REASONS:
                m.refused.labels(queue, task, reason)
            continue
        for outcome in OUTCOMES:
            m.processed.labels(queue, task, outcome)
        m.duration.labels(queue, task)
        m.wait.labels(queue, task)
        m.in_progress.labels(queue, task)
        for reason in THROTTLE_REASONS:
            m.throttled.labels(queue, task, reason)
    if worker:
        for outcome in FLOW_OUTCOMES:
            m.flows_ended.labels(outcome)
        for reason in RECYCLE_REASONS:
            m.recycled.labels(reason)
        for queue in served:
            for reason in RECOVERY_REASONS:
                m.recoveries.labels(queue, reason)
            for outcome in UNKNOWN_TYPE_OUTCOMES:
                m.unknown_types.labels(queue, outcome)
            for aggregation in app.aggregations:
                for outcome in AGGREGATION_OUTCOMES:
                    m.aggregations.labels(queue, aggregation.pattern, outcome)
        for subscription in app.subscriptions.values():
            if subscription.queue in served:
                for outcome in OUTCOMES:
                    m.deliveries.labels(subscription.event, subscription.name, outcome)


def watch_worker(worker: Worker) -> None:
    """The worker's own gauges and counters: its event loop's lag, its fetch loop's stall,
    Redis's data losses."""
    m = get_metrics()
    m.data_lost.inc(0)
    worker.loop_lag_hooks.append(m.loop_lag.set)
    worker.fetch_stall_hooks.append(m.fetch_stalled.set)
    worker.data_lost_hooks.append(m.data_lost.inc)


def set_concurrency(slots: int) -> None:
    """Task slots of this process (one Worker per process; `--processes` for more)."""
    get_metrics().concurrency.set(slots)


class _Forward:
    """Serve another registry's metrics from an endpoint's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()


class _WrittenFilesCollector(MultiProcessCollector):
    """prometheus-client's multiprocess collector, leaving out the files a starting process
    has created and not yet sized and headed: reading one fails the whole scrape (an empty
    file cannot be mapped; an unheaded one is written to, through a read-only map)."""

    def collect(self) -> Iterable[Any]:
        return self.merge([f for f in glob.glob(os.path.join(self._path, "*.db"))
                           if _headed(f)], accumulate=True)


def _headed(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:  # removed meanwhile (a process marked dead)
        return False
    return len(head) == 4 and head != b"\0\0\0\0"


def endpoint_registry(*collectors: Any, include_process: bool = True) -> CollectorRegistry:
    """The registry one HTTP endpoint serves: this process's metrics (or, in multiprocess
    mode, every process's, from the directory) plus the given collectors."""
    registry = CollectorRegistry()
    if include_process:
        path = multiprocess_dir()
        if path:
            os.makedirs(path, exist_ok=True)
            _WrittenFilesCollector(registry, path)
        else:
            registry.register(_Forward(REGISTRY))
    for collector in collectors:
        registry.register(collector)
    return registry
