"""What the pools share: the interface the executor calls, what stuck slots are, and the
error an attempt past its timeout ends with (the timers are obsq.broker.calls.Deadlines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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


def timed_out(_operation: str, seconds: float) -> TaskTimeout:
    """`overran`, as Deadlines.within reports a handler's timeout."""
    return overran(seconds)
