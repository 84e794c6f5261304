"""What every long-running part of obsq shares: the lifecycle of a background loop
(`start()`, `stop()`, and a `tick()` that says when to run next), the same loop run by one
process at a time under a Redis lock, the count of failed attempts to reach Redis that
decides the next pause, the wait for Redis at start, and the signals that stop a
process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

from obsq.broker import Broker
from obsq.clock import REDIS_CLOCK, Clock
from obsq.errors import BrokerError, StartupError
from obsq.settings import REDIS_RETRY_MAX, redis_retry_delay

log = logging.getLogger("obsq")
T = TypeVar("T")


async def reach_redis(who: str, url: str, attempt: Callable[[], Awaitable[T]],
                      stopped: asyncio.Event) -> T:
    """`attempt()` (a start's checks and first writes) until it succeeds. A Redis that does
    not answer yet (pods started together, a restart under way, a reset halfway, a network
    dropping the connection silently, each try then ending at the call deadline) is tried
    again with backoff, each try said, the process alive and not ready meanwhile; a wrong
    URL, password, version or ACL rule fails at once, as `stopped` being set does."""
    tries = 0
    while True:
        try:
            result = await attempt()
        except (StartupError, BrokerError) as exc:
            if (isinstance(exc, StartupError) and not exc.unreachable) or (
                    isinstance(exc, BrokerError) and exc.permission_denied):
                raise
            tries += 1
            pause = redis_retry_delay(tries)
            log.warning("%s cannot reach Redis yet (try %d): %s; trying again in %.1f s",
                        who, tries, exc, pause)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), pause)
            if stopped.is_set():
                raise StartupError(f"stopped before Redis could be reached: {exc}",
                                   unreachable=True) from None
            continue
        if tries:
            log.info("%s reached Redis at %s after %d failed tries", who, url, tries)
        return result


class RedisRetry:
    """Failed attempts in a row to reach Redis: the first is logged, and each gives the
    pause before the next try; a success after failures is logged once. A call the Redis
    user may not run is no outage: each such refusal is logged once, as an error, and
    retried at the longest pause until an operator changes the ACL."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self._away = False  # Redis failed to answer since the last success: logged
        self._refusals: set[str] = set()  # those logged

    def failed(self, exc: BaseException) -> float:
        self.failures += 1
        if isinstance(exc, BrokerError) and exc.permission_denied:
            if str(exc) not in self._refusals:
                self._refusals.add(str(exc))
                log.error("%s: %s", self.what, exc)
            return REDIS_RETRY_MAX
        if not self._away:
            log.warning("%s: %s; retrying", self.what, exc)
            self._away = True
        return redis_retry_delay(self.failures)

    def succeeded(self) -> None:
        if self._away:
            log.info("%s: Redis reachable again", self.what)
        self.failures = 0
        self._away = False


class BackgroundLoop:
    name = "loop"

    def __init__(self, interval: float, clock: Clock = REDIS_CLOCK) -> None:
        """`clock`: what its sleeps are measured on; a loop that waits for something to
        become due (a task, a fire, a lease's end) sleeps on the broker's clock."""
        self.interval = interval
        self.clock = clock
        self.retry = RedisRetry(self.name)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def failures(self) -> int:
        """Failed ticks in a row (Redis away): what health checks look at."""
        return self.retry.failures

    async def tick(self) -> float | None:
        """Do one round; return the seconds until the next (None: the interval)."""
        raise NotImplementedError

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The asyncio task that runs it, from start() to stop()."""
        return self._task

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name=f"obsq-{self.name}")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                wait = await self.tick()
                self.retry.succeeded()
            except BrokerError as exc:
                wait = self.retry.failed(exc)
            except Exception:
                log.exception("%s failed; retrying in %.1f s", self.name, self.interval)
                wait = None
            await self.sleep(self.interval if wait is None else wait)

    async def sleep(self, seconds: float) -> None:
        """Sleep on the loop's clock, but wake at once when stopped."""
        await self.clock.sleep(seconds, self._stopping)


class LockedLoop(BackgroundLoop):
    """A loop that any number of processes run, and one at a time does the work: each
    tick takes (or keeps) a short lock named after the loop, then calls `work()`."""

    def __init__(self, broker: Broker, owner: str, interval: float, lock_ttl: float) -> None:
        super().__init__(interval, broker.clock)
        self.broker = broker
        self.owner = owner
        self.lock_ttl = lock_ttl

    async def tick(self) -> float | None:
        if not await self.broker.try_lock(self.name, self.owner, self.lock_ttl):
            return self.lock_ttl / 2  # another process works; look again before its lock lapses
        return await self.work()

    async def work(self) -> float | None:
        raise NotImplementedError

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(BrokerError):
            await self.broker.release_lock(self.name, self.owner)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[[signal.Signals], None]) -> Callable[[], None]:
    """Call `callback(sig)` on SIGTERM and SIGINT in the running event loop (where it can:
    not outside the main thread); returns the function that removes the handlers."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, callback, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread, or not supported here

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove
