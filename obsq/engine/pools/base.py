"""What the pools share: the interface the executor calls, what stuck slots are, the
error an attempt past its timeout ends with (the timers are obsq.broker.calls.Deadlines),
and how a handler's exception is told: where it was raised, and its traceback from the
handler down, in a thread or in a child process alike."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
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


OBSQ_DIR = str(Path(__file__).parents[2]) + os.sep  # the obsq package's own files


class RemoteTraceback(Exception):
    """The traceback of a handler's exception in its child process, as the exception's
    cause; `where`: where the child saw it raised (raised_at)."""

    def __init__(self, text: str, where: str = "") -> None:
        super().__init__(text)
        self.where = where

    def __str__(self) -> str:
        return str(self.args[0])


def handler_traceback(exc: BaseException) -> str:
    """`exc` with its traceback from the first frame outside obsq: a handler's error reads
    from the handler down, not from the worker's frames that called it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _obsq_frame(tb):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def raised_at(exc: BaseException) -> str:
    """`file:line` of the innermost frame outside obsq where `exc` was raised (a handler's
    line, or a library's it called), '' when obsq raised it on its own (a timeout)."""
    if isinstance(exc.__cause__, RemoteTraceback):
        return exc.__cause__.where
    tb, found = exc.__traceback__, None
    while tb is not None:
        if not _obsq_frame(tb):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    path, cwd = found.tb_frame.f_code.co_filename, os.getcwd() + os.sep
    return f"{path[len(cwd):] if path.startswith(cwd) else path}:{found.tb_lineno}"


def _obsq_frame(tb: TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(OBSQ_DIR)
