"""The one source of "now" for the engine. Every script takes the time as its first
argument and the broker fills it from its clock; every loop that waits for something to
become due (forwarder, recoverer, janitor, scheduler, aggregator) sleeps on it.

`Clock` is Redis's clock, as in production: scripts are given 0 and read Redis's TIME, so
that workers and producers on hosts with skewed clocks agree on every due time and lease;
Python's own few reads of the wall time (an `eta` turned into a delay, a worker's start
shown in its description) are the host's. `ManualClock` moves only when told: its time
is given to every script and read by Python, and a loop sleeping on it wakes when it passes
the loop's moment (obsq.testing steps it from one due moment to the next).

What stays on the host's monotonic clock are local durations that no other process compares
with: handler timeouts, Redis call deadlines, the heartbeat thread's rhythm, a throughput
flush each second. Key expiries that Redis keeps itself (a worker's heartbeat key, sweep
locks, unique locks) follow Redis's own clock whichever clock the broker has."""

from __future__ import annotations

import asyncio
import contextlib
import time


class Clock:
    """Redis's clock (production)."""

    # Scripts read the time when they run (TIME), so a script queued behind a blocking wait
    # runs at the time it runs, and a blocking wait on Redis may stand in for a sleep.
    read_by_scripts = True

    def script_now(self) -> int:
        """The first argument of every script: 0 lets the script read Redis's TIME."""
        return 0

    def time(self) -> float:
        """The wall time in seconds, for the few reads Python makes of it."""
        return time.time()

    def monotonic(self) -> float:
        """For the time a round took, subtracted from a wait measured on this clock."""
        return time.monotonic()

    async def sleep(self, seconds: float, wake: asyncio.Event) -> None:
        """Sleep `seconds` on this clock, or until `wake` is set."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=max(seconds, 0))


REDIS_CLOCK = Clock()


class ManualClock(Clock):
    """A clock that moves only when told, for tests. Its sleepers wake when it reaches
    their moment, or all at once on `wake_all()`."""

    read_by_scripts = False

    def __init__(self, start: float | None = None) -> None:
        """`start`: the wall time it shows first (seconds since the epoch; None: now)."""
        self._ms = int((time.time() if start is None else start) * 1000)
        # each sleeper's wake-up, the moment it waits for (ms) and the task that sleeps
        self._sleepers: dict[asyncio.Future[None], tuple[int, asyncio.Task | None]] = {}
        self._awake: set[asyncio.Task] = set()  # woken, and not asleep again yet

    @property
    def now_ms(self) -> int:
        return self._ms

    def script_now(self) -> int:
        return self._ms

    def time(self) -> float:
        return self._ms / 1000

    def monotonic(self) -> float:
        return self._ms / 1000

    def next_wake(self, besides: asyncio.Task | None = None) -> int | None:
        """The soonest moment a sleeper waits for (ms), of those but the task `besides`;
        None when none sleeps."""
        return min((due for due, task in self._sleepers.values()
                    if besides is None or task is not besides), default=None)

    def sleeping(self) -> int:
        return len(self._sleepers)

    def idle(self) -> bool:
        """Whether every sleeper woken has finished its round (slept again or ended)."""
        self._awake = {task for task in self._awake if not task.done()}
        return not self._awake

    def set(self, ms: int) -> None:
        """Move the clock to `ms` (never back) and wake the sleepers whose moment came."""
        self._ms = max(self._ms, int(ms))
        for future, (due, _) in list(self._sleepers.items()):
            if due <= self._ms:
                self._wake(future)

    def wake_all(self) -> None:
        """Wake every sleeper for a round at the current time (something changed)."""
        for future in list(self._sleepers):
            self._wake(future)

    def _wake(self, future: asyncio.Future[None]) -> None:
        _, task = self._sleepers.pop(future)
        if not future.done():
            future.set_result(None)
            if task is not None:
                self._awake.add(task)

    async def sleep(self, seconds: float, wake: asyncio.Event) -> None:
        task = asyncio.current_task()
        self._awake.discard(task)
        future = asyncio.get_running_loop().create_future()
        self._sleepers[future] = (self._ms + max(int(seconds * 1000), 0), task)
        stop = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait([future, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._sleepers.pop(future, None)  # stopped before its moment
