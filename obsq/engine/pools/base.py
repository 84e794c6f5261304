"""What the pools share: the interface the executor calls, what stuck slots are, and the
timeouts that end attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from obsq.broker.calls import cancelling, uncancel
from obsq.errors import TaskTimeout

if TYPE_CHECKING:
    from obsq.app import Route
    from obsq.task import Task


@dataclass(frozen=True)
class Stuck:
    """Slots whose plain handler overran its timeout and still runs in its thread (which
    cannot be stopped), holding the slot until it returns."""

    slots: int = 0
    longest: float = 0.0  # seconds the longest-stuck of them has been stuck


@dataclass(frozen=True)
class UnsentResult:
    """What a handler returned that could not come back from its process (it does not
    pickle): treated as a result that is not JSON."""

    reason: str


class HandlerPool(Protocol):
    interrupts: bool  # True when it can stop a running handler (cancel, drain)

    async def run(self, route: Route, task: Task) -> Any:
        """The handler's return value; raises what it raised, TaskTimeout once it has run
        `task.timeout` seconds, HandlerCrashed when its process died."""

    def stuck(self) -> Stuck:
        """Safe to call from any thread (the HTTP endpoint's)."""

    def close(self) -> None:
        """Stop the idle slots; a handler still running keeps nothing alive at exit."""


def overran(seconds: float) -> TaskTimeout:
    return TaskTimeout(f"the handler ran longer than its timeout of {seconds:g} s")


class Deadlines:
    """The timeouts of the attempts awaited on one event loop (`within`), not counting the
    time the loop stood blocked meanwhile (`blocked()`: that time so far,
    obsq/engine/liveness.py).

    Attempts of one timeout length fall due in the order they started, so one timer per
    length, armed for the first of them, watches them all; when it fires it ends those past
    due and is armed again for the next. A timer armed and cancelled per attempt cost each
    attempt 3 µs of the worker's CPU (uvloop). An attempt's timeout cancels its task, told
    apart from a cancellation from outside as asyncio.timeout does (Task.cancelling and
    uncancel, Python 3.11+; on 3.10 one that comes with the timeout is merged into it). The
    call runs in the caller's task, on every Python: asyncio.wait_for's task of its own
    starts it a loop iteration late (a child's reply that came first was lost) and hides the
    handler's runner from current_task()."""

    def __init__(self, blocked: Callable[[], float] = lambda: 0.0) -> None:
        self._blocked = blocked
        self._running: dict[float, dict[_Attempt, None]] = {}  # by length, in start order
        self._timers: dict[float, asyncio.TimerHandle] = {}  # by length
        self._loop: asyncio.AbstractEventLoop | None = None  # where the timers are armed

    async def within(self, call: Awaitable[Any], seconds: float) -> Any:
        """`await call`, or TaskTimeout after `seconds` (the call is then cancelled)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or used again on another loop
            self._loop, self._running, self._timers = loop, {}, {}
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a timeout needs a task to cancel")
        attempt = _Attempt(task, loop.time(), self._blocked())
        running = self._running.get(seconds)
        if running is None:
            running = self._running[seconds] = {}
        running[attempt] = None
        if seconds not in self._timers:
            self._timers[seconds] = loop.call_at(attempt.start + seconds, self._due, loop,
                                                 seconds)
        try:
            result = await call
        except BaseException as exc:
            if _ended(attempt, running) and isinstance(exc, asyncio.CancelledError):
                raise overran(seconds) from None
            raise
        _ended(attempt, running)
        return result

    def _due(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        if loop is not self._loop:
            return  # armed on a loop no longer used
        running = self._running[seconds]
        now, blocked = loop.time(), self._blocked()
        while running:
            attempt = next(iter(running))
            due = attempt.start + seconds + blocked - attempt.before
            if due > now:
                self._timers[seconds] = loop.call_at(due, self._due, loop, seconds)
                return
            del running[attempt]
            attempt.expired = True
            attempt.task.cancel()
        del self._timers[seconds], self._running[seconds]  # a length no longer in use


class _Attempt:
    __slots__ = ("before", "cancelling", "expired", "start", "task")

    def __init__(self, task: asyncio.Task[Any], start: float, before: float) -> None:
        self.task = task
        self.cancelling = cancelling(task)  # cancellations asked from outside before it
        self.start = start
        self.before = before  # the loop's blocked time at the start
        self.expired = False


def _ended(attempt: _Attempt, running: dict[_Attempt, None]) -> bool:
    """The attempt is no longer watched; whether its own timeout cancelled it (and nothing
    from outside asked for its cancellation meanwhile)."""
    running.pop(attempt, None)
    return attempt.expired and uncancel(attempt.task) <= attempt.cancelling
