"""The deadline of a producer's call: a web app's request must not wait for ever on a Redis
that was stopped (SIGSTOP, a frozen VM) or sits behind a stuck proxy, where the kernel
still accepts the bytes and TCP keepalive sees nothing wrong.

On the event loop a call that outlives its deadline is cancelled, wherever it waits (pool
checkout, connect, a round trip): no socket timeout, which redis-py turns into a task per
command, and no timer per call either (asyncio.timeout cost an enqueue 13 µs of its 45 µs
of CPU; this costs 0.6 µs): the calls of one Client share one length of deadline, so they
fall due in the order they started, and one timer walks them. Cancelling a redis-py call
halfway closes its connection, so a reply that arrives late is never read as the answer to
the next call.

The blocking client of the SyncClient cannot be interrupted; its sockets, connects and
pool waits get the deadline as their timeout instead (connection.create_client).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from obsq.errors import ConfigurationError
from obsq.seconds import is_seconds, seconds_rule
from obsq.settings import CALL_TIMEOUT

T = TypeVar("T")
P = ParamSpec("P")
TimedOut = Callable[[str, float], BaseException]  # (operation, seconds) -> the error raised


def cancelling(task: asyncio.Task[Any]) -> int:
    """The cancellations asked of `task` and not taken back, where tasks count them
    (Python 3.11+, or on 3.10 a task factory's tasks that backport it, as pytest-asyncio's
    runner's); else 0: a cancellation caught is simply over."""
    counted = getattr(task, "cancelling", None)
    return counted() if counted is not None else 0


def uncancel(task: asyncio.Task[Any]) -> int:
    """Take back a cancellation of `task` that its own code caught; the ones left."""
    taken = getattr(task, "uncancel", None)
    return taken() if taken is not None else 0


class CallDeadlines:
    """Deadlines of `seconds` for calls on one event loop; `timed_out(operation, seconds)`
    makes the error a late call raises."""

    def __init__(self, seconds: float, timed_out: TimedOut) -> None:
        self.seconds = seconds
        self._timed_out = timed_out
        self._calls: dict[int, tuple[asyncio.Task[Any], float]] = {}  # by start, so by due
        self._expired: set[int] = set()
        self._keys = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, operation: str, call: Awaitable[T]) -> T:
        """`call`'s result, or the timed_out error once `seconds` have passed without one."""
        task = asyncio.current_task()
        assert task is not None  # a coroutine runs in a task
        loop = task.get_loop()
        key, due = next(self._keys), loop.time() + self.seconds
        self._calls[key] = (task, due)
        if self._timer is None:
            self._timer = loop.call_at(due, self._expire, loop)
        cancelled_before = cancelling(task)
        try:
            return await call
        except asyncio.CancelledError:
            if key not in self._expired or uncancel(task) > cancelled_before:
                raise  # cancelled by someone else (too)
            raise self._timed_out(operation, self.seconds) from None
        finally:
            del self._calls[key]
            if self._expired:
                self._expired.discard(key)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the calls that are due, and wake again when the next one is."""
        self._timer = None
        now = loop.time()
        for key, (task, due) in self._calls.items():
            if due > now:
                self._timer = loop.call_at(due, self._expire, loop)
                return
            if key not in self._expired:
                self._expired.add(key)
                task.cancel()


class Producer(Protocol):
    """What a method under `deadline` belongs to: a Client."""

    deadlines: CallDeadlines


Method = Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]


def deadline(operation: str) -> Callable[[Method[P, T]], Method[P, T]]:
    """The decorated producer method ends within its object's deadlines, else raises their
    error (BrokerTimeout, reported to the broker's error hooks under `operation`)."""
    def bound(method: Method[P, T]) -> Method[P, T]:
        @functools.wraps(method)
        def bounded(self: Producer, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
            # the coroutine of run() itself: no frame of its own in every call
            return self.deadlines.run(operation, method(self, *args, **kwargs))
        return bounded
    return bound


def call_timeout_of(value: float | None) -> float:
    """A Client's call deadline: `value`, else OBSQ_CALL_TIMEOUT, else CALL_TIMEOUT; a
    number of seconds obsq can keep (obsq/seconds.py)."""
    if value is None:
        raw = os.environ.get("OBSQ_CALL_TIMEOUT", "").strip()
        try:
            value = float(raw) if raw else CALL_TIMEOUT
        except ValueError:
            raise ConfigurationError(f"OBSQ_CALL_TIMEOUT={raw!r} is not a number of "
                                     "seconds") from None
    if not is_seconds(value):
        raise ConfigurationError(f"call_timeout must be {seconds_rule()}, got {value!r}")
    return float(value)
