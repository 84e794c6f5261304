"""The three systems under test, each with the same four entry points, run in a child:

- ``worker(url, concurrency, ctl, ready, ...)``: build one worker process' worker, call
  ``ready()``, wait for GO, run until STOP, then return.
- ``enqueue(url, n, mode, task)``: enqueue ``n`` tasks of ``task`` (``noop`` or ``io``)
  one at a time (``single``), with the system's bulk path (``bulk``), and for obsq also
  with its blocking client (``sync``: SyncClient) and as batches of 1,000 concurrent
  calls (``concurrent``: ``asyncio.gather`` of ``Client.enqueue``); returns the elapsed
  seconds.
- ``pickup(url, n, rate)``: enqueue ``n`` ``lat`` tasks at ``rate`` per second, one at a
  time, each carrying ``time.time()``; returns the elapsed seconds.

Handlers: ``noop`` does nothing but count; ``io`` makes one awaited Redis call (INCR on
the same server), as a realistic handler does; ``lat`` records ``time.time() - t``.
``ping(url, n, mode)``: the round-trip limit beside them, redis-py PING one at a time,
``sync`` or ``async``.
Parent-side knowledge (which keys tell that a queue is drained) lives in run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
import time

NAMESPACE = "bench"
CONCURRENT = 1000  # enqueue calls in flight at once in the `concurrent` mode


class State:
    def __init__(self) -> None:
        self.calls = 0  # redis round trips (counted by child.py)
        self.handled = 0  # handler runs
        self.latencies: list[float] = []  # pickup latencies in seconds
        self.lock = threading.Lock()
        self.tracing_exporter: bool | None = None  # obsq: did setup_tracing() install one
        self.url = ""  # of the Redis the worker serves (the `io` handler calls it)
        self.loop = ""  # obsq: the event loop its worker ran on


STATE = State()


# --------------------------------------------------------------------------- obsq


class Obsq:
    @staticmethod
    def _app():
        import obsq

        app = obsq.App(namespace=NAMESPACE)

        @app.task("noop")
        async def noop(task):
            STATE.handled += 1

        @app.task("lat")
        async def lat(task):
            STATE.latencies.append(time.time() - task.payload["t"])
            STATE.handled += 1

        @app.task("io")
        async def io(task):
            await io_redis(STATE.url).incr("bench:io")
            STATE.handled += 1

        return app

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, metrics=False, tracing=False, http_port=0):
        import obsq
        from obsq.observability import run_worker, setup_tracing, shutdown_tracing

        STATE.url = url
        # Import time is not counted: run_worker imports its wiring (metrics, the endpoint,
        # prometheus_client) on first use, 50 ms of CPU, 2.5 µs a task of a drain of 20,000
        # that is start-up, not a task's cost; imported here, before the clock starts
        with contextlib.suppress(ImportError):  # a version without it
            import obsq.observability.processes
        if tracing:  # as `obsq worker` does: an SDK provider exporting per OTEL_* variables
            STATE.tracing_exporter = setup_tracing("obsq-bench")
        app = cls._app()
        worker = obsq.Worker(app, redis_url=url, queues={"default": 1},
                             concurrency=concurrency, handle_signals=False)

        async def main():
            loop = asyncio.get_running_loop()
            ready()
            if not await loop.run_in_executor(None, ctl.wait_go):
                return
            ctl.on_stop(lambda: loop.call_soon_threadsafe(worker.stop))
            # as `obsq worker` runs it: metrics and tracing through the App's hooks
            await run_worker(worker, metrics=metrics, tracing=tracing,
                             http_port=http_port if metrics and http_port else None,
                             http_host="127.0.0.1")

        try:
            run_on_loop(main())
        finally:
            shutdown_tracing()

    @staticmethod
    def enqueue(url, n, mode, task="noop"):
        import obsq

        if mode == "sync":
            client = obsq.SyncClient(url, namespace=NAMESPACE)
            client.enqueue(task, {"i": -1})  # the queue registered, the script loaded
            t0 = time.perf_counter()
            for i in range(1, n):
                client.enqueue(task, {"i": i})
            elapsed = time.perf_counter() - t0
            client.close()
            return elapsed * n / (n - 1)

        async def main():
            client = obsq.Client(url, namespace=NAMESPACE)
            t0 = time.perf_counter()
            if mode == "single":
                for i in range(n):
                    await client.enqueue(task, {"i": i})
            elif mode == "concurrent":
                for start in range(0, n, CONCURRENT):
                    await asyncio.gather(*(client.enqueue(task, {"i": i})
                                           for i in range(start, min(n, start + CONCURRENT))))
            else:
                for start in range(0, n, 1000):
                    await client.enqueue_many(
                        [obsq.Job(task, {"i": i}) for i in range(start, min(n, start + 1000))]
                    )
            elapsed = time.perf_counter() - t0
            await client.close()
            return elapsed

        return asyncio.run(main())

    @staticmethod
    def pickup(url, n, rate):
        import obsq

        async def main():
            client = obsq.Client(url, namespace=NAMESPACE)
            t0 = time.perf_counter()
            for i in range(n):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await client.enqueue("lat", {"t": time.time()})
            elapsed = time.perf_counter() - t0
            await client.close()
            return elapsed

        return asyncio.run(main())


def run_on_loop(main):
    """Run obsq's worker on the event loop `obsq worker` would pick (OBSQ_LOOP), or on
    asyncio's where the obsq under test predates the choice (a baseline ref)."""
    run = _eventloop_run()
    if run is None:
        STATE.loop = "asyncio"
        return asyncio.run(main)
    from obsq.settings import WorkerSettings

    choice = WorkerSettings.from_env().loop
    STATE.loop = "uvloop" if choice != "asyncio" and _has_uvloop() else "asyncio"
    return run(main, choice)


def _eventloop_run():
    """obsq's `run(main, choice)` wherever the obsq under test keeps it (a baseline ref may
    be older than the package's layers), or None where it predates the choice of loop."""
    for module in ("obsq.engine.eventloop", "obsq.eventloop"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(module).run
    return None


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------- dramatiq


class Dramatiq:
    """dramatiq's RedisBroker with its default middleware; actors are plain functions
    (dramatiq runs them in worker threads)."""

    @staticmethod
    def _broker(url):
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=url)
        dramatiq.set_broker(broker)

        @dramatiq.actor(actor_name="noop", queue_name="default", max_retries=0)
        def noop(i):
            with STATE.lock:
                STATE.handled += 1

        @dramatiq.actor(actor_name="lat", queue_name="default", max_retries=0)
        def lat(t):
            now = time.time()
            with STATE.lock:
                STATE.latencies.append(now - t)
                STATE.handled += 1

        @dramatiq.actor(actor_name="io", queue_name="default", max_retries=0)
        def io(i):
            sync_io_redis(url).incr("bench:io")
            with STATE.lock:
                STATE.handled += 1

        return broker, {"noop": noop, "io": io}, lat

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, **_):
        import dramatiq

        broker, _actors, _lat = cls._broker(url)
        worker = dramatiq.Worker(broker, worker_threads=concurrency)
        ready()
        if not ctl.wait_go():
            return
        worker.start()
        ctl.stopped.wait()
        worker.stop()
        broker.close()

    @classmethod
    def enqueue(cls, url, n, mode, task="noop"):
        broker, actors, _lat = cls._broker(url)
        actor = actors[task]
        t0 = time.perf_counter()
        if mode == "single":
            for i in range(n):
                actor.send(i)
        else:  # no bulk API: broker.enqueue in a loop
            for i in range(n):
                broker.enqueue(actor.message(i))
        elapsed = time.perf_counter() - t0
        broker.close()
        return elapsed

    @classmethod
    def pickup(cls, url, n, rate):
        broker, _actors, lat = cls._broker(url)
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            lat.send(time.time())
        elapsed = time.perf_counter() - t0
        broker.close()
        return elapsed


# ------------------------------------------------------------------------- taskiq


class Taskiq:
    """taskiq with taskiq-redis' acknowledging RedisStreamBroker (consumer group)."""

    @staticmethod
    def _broker(url):
        from taskiq_redis import RedisStreamBroker

        # consumer_id="0": the group sees messages sent before it was created
        broker = RedisStreamBroker(url, queue_name="taskiq", consumer_id="0")

        @broker.task(task_name="noop")
        async def noop(i: int) -> None:
            STATE.handled += 1

        @broker.task(task_name="lat")
        async def lat(t: float) -> None:
            STATE.latencies.append(time.time() - t)
            STATE.handled += 1

        @broker.task(task_name="io")
        async def io(i: int) -> None:
            await io_redis(url).incr("bench:io")
            STATE.handled += 1

        return broker, {"noop": noop, "io": io}, lat

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, **_):
        from taskiq.api import run_receiver_task

        broker, _tasks, _lat = cls._broker(url)

        async def main():
            loop = asyncio.get_running_loop()
            ready()
            if not await loop.run_in_executor(None, ctl.wait_go):
                return
            stopped = loop.create_future()
            ctl.on_stop(lambda: loop.call_soon_threadsafe(stopped.set_result, None))
            task = asyncio.create_task(
                run_receiver_task(broker, max_async_tasks=concurrency, run_startup=True)
            )
            await stopped
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await broker.shutdown()

        asyncio.run(main())

    @classmethod
    def enqueue(cls, url, n, mode, task="noop"):
        broker, tasks, _lat = cls._broker(url)

        async def main():
            await broker.startup()
            t0 = time.perf_counter()
            for i in range(n):  # no bulk API: kiq in a loop for both modes
                await tasks[task].kiq(i)
            elapsed = time.perf_counter() - t0
            await broker.shutdown()
            return elapsed

        return asyncio.run(main())

    @classmethod
    def pickup(cls, url, n, rate):
        broker, _tasks, lat = cls._broker(url)

        async def main():
            await broker.startup()
            t0 = time.perf_counter()
            for i in range(n):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await lat.kiq(time.time())
            elapsed = time.perf_counter() - t0
            await broker.shutdown()
            return elapsed

        return asyncio.run(main())


SYSTEMS = {"obsq": Obsq, "dramatiq": Dramatiq, "taskiq": Taskiq}

# ------------------------------------------------------------- shared by the systems

_io_clients: dict = {}


def io_redis(url):
    """The asyncio redis-py client the `io` handlers call (one per worker process)."""
    client = _io_clients.get(("async", url))
    if client is None:
        import redis.asyncio

        client = _io_clients["async", url] = redis.asyncio.Redis.from_url(url)
    return client


def sync_io_redis(url):
    """The blocking redis-py client of dramatiq's `io` actor (thread safe)."""
    client = _io_clients.get(("sync", url))
    if client is None:
        import redis

        client = _io_clients["sync", url] = redis.Redis.from_url(url)
    return client


def ping(url, n, mode):
    """`n` PINGs one at a time with redis-py (`sync` or `async`): the round trip every
    enqueue pays, the limit the producers are measured against."""
    if mode == "sync":
        import redis

        r = redis.Redis.from_url(url)
        r.ping()
        t0 = time.perf_counter()
        for _ in range(n):
            r.ping()
        elapsed = time.perf_counter() - t0
        r.close()
        return elapsed

    async def main():
        import redis.asyncio

        r = redis.asyncio.Redis.from_url(url)
        await r.ping()
        t0 = time.perf_counter()
        for _ in range(n):
            await r.ping()
        elapsed = time.perf_counter() - t0
        await r.aclose()
        return elapsed

    return asyncio.run(main())
