"""What the pools share: the interface the executor calls, what stuck slots are, and the
timeout that ends an attempt."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from obsq.errors import TaskTimeout
from obsq.loop_watch import StretchedTimeout

if TYPE_CHECKING:
    from obsq.app import Route
    from obsq.task import Task


@dataclass(frozen=True)
class Stuck:
    """Slots whose handler overran its timeout and still runs in a thread of its own."""

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
        """Stop the idle slots; abandoned handlers keep nothing alive at exit."""


def overran(seconds: float) -> TaskTimeout:
    return TaskTimeout(f"the handler ran longer than its timeout of {seconds:g} s")


if sys.version_info >= (3, 11):
    async def within(call: Awaitable[Any], seconds: float,
                     loop_blocked: Callable[[], float] = lambda: 0.0) -> Any:
        """`await call`, or TaskTimeout after `seconds` (the call is then cancelled), not
        counting the time the event loop stood blocked meanwhile (`loop_blocked()`: that
        time so far, obsq/loop_watch.py)."""
        try:
            async with StretchedTimeout(seconds, loop_blocked) as scope:
                return await call
        except TimeoutError:
            if scope.expired():
                raise overran(seconds) from None
            raise
else:  # pragma: no cover - Python 3.10
    async def within(call: Awaitable[Any], seconds: float,
                     loop_blocked: Callable[[], float] = lambda: 0.0) -> Any:
        """`await call`, or TaskTimeout after `seconds` (the call is then cancelled)."""
        import asyncio

        try:
            return await asyncio.wait_for(call, seconds)
        except asyncio.TimeoutError:
            raise overran(seconds) from None
