"""Watching a worker's event loop for handlers that block it (a sync library call in an
`async def`): how late the loop runs (its lag, for the metric and the liveness probe), a
watchdog thread that names the blocking handler and logs where it blocks, and the time the
loop stood blocked, which handler timeouts do not count (obsq/engine/pools/base.py, Deadlines).

While the loop is blocked nothing on it runs: a handler awaiting I/O has not overrun its
timeout because another handler held the loop, so its deadline moves later by the time
the loop stood blocked (a handler that blocks the loop itself is not interrupted either:
nothing can interrupt it, and once it returns its work is done)."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

from obsq.hooks import Hooks

log = logging.getLogger("obsq")
TICK = 0.1  # the monitor's period on the loop
BLOCKED_AT_LEAST = 0.25  # lateness below this is a busy loop, not a blocked one
STACK_FRAMES = 25  # of the loop thread's stack, in the watchdog's warning


class LoopMonitor:
    """A callback every TICK on the loop: how late it runs is the loop's lag, and the
    lateness past BLOCKED_AT_LEAST adds up to the time the loop stood blocked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread_id = threading.get_ident()  # made on the loop's thread
        self.blocked_total = 0.0
        self._due = loop.time() + TICK
        self._counted_to = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._due = self.loop.time() + TICK
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def lag(self) -> float:
        """How late the loop is now (any thread): 0 while it runs its callbacks in time."""
        if self._handle is None:
            return 0.0
        return max(time.monotonic() - self._due, 0.0)

    def blocked(self) -> float:
        """Seconds the loop has stood blocked since it started, counted up to now (call on
        the loop: each attempt of an async handler does)."""
        now = self.loop.time()
        late = now - max(self._due, self._counted_to)
        if late >= BLOCKED_AT_LEAST:
            self.blocked_total += late
            self._counted_to = now
        return self.blocked_total

    def _tick(self) -> None:
        self.blocked()
        self._due = self.loop.time() + TICK
        self._handle = self.loop.call_at(self._due, self._tick)


class LoopWatchdog:
    """A thread that looks at the loop's lag twice a second: past `warn_after` it logs the
    handler running on the loop (`running()`: who it is, or None) and the loop thread's
    stack, once per blocking; and it tells `lag_hooks` each lag it reads (the metric)."""

    def __init__(self, monitor: LoopMonitor, warn_after: float,
                 running: Callable[[], str | None],
                 lag_hooks: Hooks[[float]] | None = None) -> None:
        self.monitor = monitor
        self.warn_after = warn_after
        self.running = running
        self.lag_hooks = Hooks("loop-lag hook") if lag_hooks is None else lag_hooks
        self.period = min(0.5, warn_after / 2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="obsq-loop-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        longest = 0.0  # of the blocking warned about; 0: none
        while not self._stop.wait(self.period):
            lag = self.monitor.lag()
            self.lag_hooks(lag)
            if lag >= self.warn_after and not longest:
                self._warn(lag)
            if longest and lag < BLOCKED_AT_LEAST:
                log.warning("the event loop runs again after being blocked for %.1f s or more",
                            longest)
                longest = 0.0
            elif lag >= self.warn_after:
                longest = max(longest, lag)

    def _warn(self, lag: float) -> None:
        frame = sys._current_frames().get(self.monitor.thread_id)
        stack = "".join(traceback.format_stack(frame, limit=STACK_FRAMES)) if frame else ""
        log.warning("the event loop has been blocked for %.1f s by %s: a handler calls "
                    "blocking code in an async def (await an asyncio call instead, or make "
                    "the handler a plain def, which runs in a thread); the heartbeat and "
                    "leases go on, but every other task of this worker waits. Where it "
                    "blocks:\n%s", lag, self.running() or "code outside any handler",
                    stack.rstrip())
