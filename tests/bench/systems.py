"""The three systems under test, each with the same four entry points, run in a child:

- ``worker(url, concurrency, ctl, ready, ...)``: build one worker process' worker, call
  ``ready()``, wait for GO, run until STOP, then return.
- ``enqueue(url, n, mode)``: enqueue ``n`` no-op tasks one at a time (``single``) or with
  the system's bulk path (``bulk``); returns the elapsed seconds.
- ``pickup(url, n, rate)``: enqueue ``n`` ``lat`` tasks at ``rate`` per second, one at a
  time, each carrying ``time.time()``; returns the elapsed seconds.

Handlers: ``noop`` does nothing but count; ``lat`` records ``time.time() - t``.
Parent-side knowledge (which keys tell that a queue is drained) lives in run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time

NAMESPACE = "bench"


class State:
    def __init__(self) -> None:
        self.calls = 0  # redis round trips (counted by child.py)
        self.handled = 0  # handler runs
        self.latencies: list[float] = []  # pickup latencies in seconds
        self.lock = threading.Lock()
        self.tracing_exporter: bool | None = None  # obsq: did setup_tracing() install one


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

        return app

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, metrics=False, tracing=False, http_port=0):
        import obsq
        from obsq.observability import setup_tracing, shutdown_tracing

        if tracing:  # as `obsq worker` does: an SDK provider exporting per OTEL_* variables
            STATE.tracing_exporter = setup_tracing("obsq-bench")
        app = cls._app()
        kwargs = dict(
            redis_url=url, queues={"default": 1}, concurrency=concurrency,
            metrics=metrics, tracing=tracing,
        )
        params = inspect.signature(obsq.Worker).parameters
        if http_port and "http_port" in params:
            kwargs["http_port"] = http_port
        worker = obsq.Worker(app, **kwargs)

        async def main():
            loop = asyncio.get_running_loop()
            ready()
            if not await loop.run_in_executor(None, ctl.wait_go):
                return

            pending = []

            def stop():
                r = worker.stop()
                if inspect.isawaitable(r):
                    pending.append(asyncio.ensure_future(r))

            ctl.on_stop(lambda: loop.call_soon_threadsafe(stop))
            await worker.run()

        try:
            asyncio.run(main())
        finally:
            shutdown_tracing()

    @staticmethod
    def enqueue(url, n, mode):
        import obsq

        async def main():
            client = obsq.Client(url, namespace=NAMESPACE)
            t0 = time.perf_counter()
            if mode == "single":
                for i in range(n):
                    await client.enqueue("noop", {"i": i})
            else:
                for start in range(0, n, 1000):
                    await client.enqueue_many(
                        [obsq.Job("noop", {"i": i}) for i in range(start, min(n, start + 1000))]
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

        return broker, noop, lat

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, **_):
        import dramatiq

        broker, _noop, _lat = cls._broker(url)
        worker = dramatiq.Worker(broker, worker_threads=concurrency)
        ready()
        if not ctl.wait_go():
            return
        worker.start()
        ctl.stopped.wait()
        worker.stop()
        broker.close()

    @classmethod
    def enqueue(cls, url, n, mode):
        broker, noop, _lat = cls._broker(url)
        t0 = time.perf_counter()
        if mode == "single":
            for i in range(n):
                noop.send(i)
        else:  # no bulk API: broker.enqueue in a loop
            for i in range(n):
                broker.enqueue(noop.message(i))
        elapsed = time.perf_counter() - t0
        broker.close()
        return elapsed

    @classmethod
    def pickup(cls, url, n, rate):
        broker, _noop, lat = cls._broker(url)
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

        return broker, noop, lat

    @classmethod
    def worker(cls, url, concurrency, ctl, ready, **_):
        from taskiq.api import run_receiver_task

        broker, _noop, _lat = cls._broker(url)

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
    def enqueue(cls, url, n, mode):
        broker, noop, _lat = cls._broker(url)

        async def main():
            await broker.startup()
            t0 = time.perf_counter()
            for i in range(n):  # no bulk API: kiq in a loop for both modes
                await noop.kiq(i)
            elapsed = time.perf_counter() - t0
            await broker.shutdown()
            return elapsed

        return asyncio.run(main())

    @classmethod
    def pickup(cls, url, n, rate):
        broker, _noop, lat = cls._broker(url)

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
