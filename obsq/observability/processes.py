"""The processes obsq runs, with their metrics, tracing and endpoint wired on: a worker, a
scheduler, and `obsq exporter` (only the queue gauges). The engine knows nothing of this;
the `obsq` command calls these, and so can anyone who builds a Worker in code:

    await obsq.observability.run_worker(obsq.Worker(app, ...), http_port=9191)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from obsq._version import __version__
from obsq.background import on_stop_signals
from obsq.broker import Broker
from obsq.engine.liveness import LIVENESS, READINESS, first_problem
from obsq.observability.instrument import instrument_app, instrument_client
from obsq.observability.probes import RedisWatch, loop_liveness

if TYPE_CHECKING:
    from obsq.app import App
    from obsq.engine.scheduler import Scheduler
    from obsq.engine.worker import Worker
    from obsq.observability.collector import QueueCollector
    from obsq.observability.http import HealthServer

    Serving = Callable[[HealthServer], None]  # told the endpoint once it listens

log = logging.getLogger("obsq")


def serve_worker(worker: Worker, host: str, port: int, *, queue_metrics: bool = True
                 ) -> HealthServer:
    """The endpoint of `worker` (call it on the worker's event loop; port 0: a free one).
    /healthz judges the process alone (obsq/engine/liveness.py LIVENESS: its event loop not
    blocked past the limit, its heartbeat thread and fetch loop coming round); /readyz:
    started, not draining, Redis answering, the fetch loop coming round (READINESS).
    `queue_metrics`: with the queue-wide gauges of its queues (off where an `obsq exporter`
    publishes them for the installation)."""
    # imported here, as the metrics below: prometheus_client and the collectors cost a
    # worker that serves neither metrics nor probes 1.5 MB of memory
    from obsq.observability.collector import QueueCollector
    from obsq.observability.http import HealthServer
    from obsq.observability.metrics import endpoint_registry

    loop = asyncio.get_running_loop()
    collectors = [QueueCollector(worker.broker, loop, list(worker.queues),
                                 loop_lag=lambda: worker.health().loop_lag)
                  ] if queue_metrics else []
    _push_queue_gauges(collectors)
    registry = endpoint_registry(*collectors)

    def status() -> dict[str, Any]:
        health = worker.health()
        about = worker.describe()
        return {"worker": about["id"], "version": __version__, "queues": about["queues"],
                "concurrency": about["concurrency"], "busy": about["busy"],
                "processed": about["processed"],
                "heartbeat_age": round(health.heartbeat_age, 3),
                "draining": health.draining, "pool": about["pool"],
                "stuck_slots": health.stuck_slots,
                "uptime": round(time.time() - about["started"], 3) if about["started"] else 0.0}

    return HealthServer(host, port, registry,
                        live=lambda: first_problem(worker.health(), LIVENESS),
                        ready=lambda: first_problem(worker.health(), READINESS), status=status)


async def run_worker(worker: Worker, *, http_port: int | None = None,
                     http_host: str = "0.0.0.0", metrics: bool = True, tracing: bool = True,
                     queue_metrics: bool = True, serving: Serving | None = None) -> None:
    """Run `worker` with obsq's metrics and tracing on its App and, given a port (0: any
    free one; None or negative: none), its HTTP endpoint, started before the worker so that
    a taken port stops the start; `queue_metrics`: see serve_worker. `serving(server)` is
    told the endpoint once it listens."""
    instrument_app(worker.app, metrics=metrics, tracing=tracing,
                   concurrency=worker.concurrency, queues=worker.queues,
                   worker_id=worker.id, redis_url=worker.broker.url)
    if tracing and worker.settings.pool == "process":
        # imported here: multiprocessing and pickle, which it brings, cost every worker
        # whose pool is not the process pool 2 MB of memory
        from obsq.engine.pools.child import on_child_start

        on_child_start(trace_handler_process)
    if metrics:
        from obsq.observability.metrics import watch_worker

        watch_worker(worker)
    # a SIGTERM right after the endpoint's first answer, before worker.run put its own
    # handlers in place, is a drain too, not Python's default death
    remove_signals = on_stop_signals(lambda sig: worker.stop()) if worker.handle_signals \
        else None
    server = None
    try:
        if http_port is not None and http_port >= 0:
            server = serve_worker(worker, http_host, http_port, queue_metrics=queue_metrics)
            if serving is not None:
                serving(server)
        running = asyncio.ensure_future(worker.run())
        try:
            if server is not None:
                started = asyncio.ensure_future(worker.started.wait())
                await asyncio.wait([running, started], return_when=asyncio.FIRST_COMPLETED)
                started.cancel()
                if worker.started.is_set():
                    log.info("worker %s: metrics and probes on :%d", worker.id, server.port)
            await running
        finally:
            if not running.done():  # cancelled from outside: the worker drains first
                worker.stop()
                await asyncio.shield(running)
    finally:
        if remove_signals is not None:
            remove_signals()
        if server is not None:
            await asyncio.to_thread(server.close)


def _push_queue_gauges(collectors: list[QueueCollector]) -> None:
    """The queue-wide gauges pushed over OTLP too, when OTEL_METRICS_EXPORTER asks."""
    from obsq.observability.otel_metrics import messaging_meters

    meters = messaging_meters()
    if meters is not None:
        for collector in collectors:
            meters.observe_queues(collector)


def trace_handler_process(app: App) -> None:
    """In a child process of the process pool: export its spans as the worker does, and
    put the trace context into the tasks its handlers enqueue through Clients of the App
    (the worker's App got the same when run_worker instrumented it). Its buffered spans
    are sent when it ends by itself (multiprocessing runs its finalizers, not atexit)."""
    from multiprocessing.util import Finalize

    from obsq.observability.tracing import setup_tracing, shutdown_tracing

    setup_tracing()
    instrument_app(app, metrics=False, tracing=True)
    Finalize(None, shutdown_tracing, exitpriority=10)


async def run_scheduler(scheduler: Scheduler, *, http_port: int | None = None,
                        http_host: str = "0.0.0.0", metrics: bool = True,
                        serving: Serving | None = None) -> None:
    """Run `scheduler` with send spans and enqueue counts on its client, its fires and
    missed fires counted per entry, and, given a port, its endpoint: /healthz while its
    event loop answers, /readyz while Redis answers."""
    from obsq.observability.http import HealthServer
    from obsq.observability.metrics import SchedulerMetrics, endpoint_registry

    instrument_client(scheduler.client)
    if metrics:
        counting = SchedulerMetrics()
        scheduler.on_fire(counting.on_fire)
        scheduler.on_entries(counting.on_entries)
    remove_signals = on_stop_signals(lambda sig: scheduler.stop()) \
        if scheduler.handle_signals else None  # before the endpoint answers, as run_worker
    server = None
    try:
        if http_port is not None and http_port >= 0:
            server = HealthServer(
                http_host, http_port, endpoint_registry(),
                live=loop_liveness(asyncio.get_running_loop()),
                ready=scheduler.ready,
                status=scheduler.describe)
            log.info("scheduler: metrics and probes on :%d", server.port)
            if serving is not None:
                serving(server)
        await scheduler.run()
    finally:
        if remove_signals is not None:
            remove_signals()
        if server is not None:
            await asyncio.to_thread(server.close)


async def run_exporter(redis_url: str, namespace: str, port: int, *,
                       host: str = "0.0.0.0", serving: Serving | None = None) -> None:
    """`obsq exporter`: the queue-wide gauges of every queue in Redis, until SIGTERM/SIGINT.
    /healthz: the event loop answers; /readyz: Redis answered the last ping."""
    from obsq.observability.collector import QueueCollector
    from obsq.observability.http import HealthServer
    from obsq.observability.metrics import endpoint_registry

    broker = Broker(redis_url, namespace)
    await broker.check()
    await broker.check_memory_policy(refuse=False)  # it loses nothing itself: it warns
    loop = asyncio.get_running_loop()
    watch = RedisWatch(broker)
    collector = QueueCollector(broker, loop, broker.queues)
    _push_queue_gauges([collector])
    registry = endpoint_registry(collector, include_process=False)
    started = time.time()

    def status() -> dict[str, Any]:
        return {"exporter": True, "version": __version__, "namespace": namespace,
                "redis_ok": watch.ok, "uptime": round(time.time() - started, 3)}

    stop = asyncio.Event()
    remove_signals = on_stop_signals(lambda sig: stop.set())  # before the endpoint answers
    server = None
    try:
        server = HealthServer(host, port, registry, live=loop_liveness(loop),
                              ready=watch.problem, status=status)
        log.info("exporter serving the queue gauges of namespace %s on :%d", namespace,
                 server.port)
        if serving is not None:
            serving(server)
        await watch.run(stop)
    finally:
        remove_signals()
        if server is not None:
            await asyncio.to_thread(server.close)
        await broker.close()
        log.info("exporter stopped")
