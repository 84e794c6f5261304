"""The event loop a worker runs on. uvloop (libuv's loop, the `uvloop` extra, which the image
installs) where it is installed: a worker spends much of its CPU per task in the loop's own
machinery (tasks, timers, socket writes), which uvloop does in C. asyncio's own loop stays
the fallback. `WorkerSettings.loop` (OBSQ_LOOP, `--loop`): `auto` (the default: uvloop if
installed), `uvloop` (a worker without it does not start) or `asyncio`. The process's
garbage collector is paced for a worker too (pace_collector)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

from obsq.errors import ConfigurationError
from obsq.settings import LOOPS

T = TypeVar("T")
PYTHON_THRESHOLDS = (700, 10, 10)  # the collector's default pace
YOUNG_THRESHOLD = 10_000


def uses_uvloop(choice: str) -> bool:
    """Whether the loop `choice` (one of settings.LOOPS) names is uvloop's."""
    if choice not in LOOPS:
        raise ConfigurationError(f"loop must be {', '.join(LOOPS)}, got {choice!r}")
    if choice == "asyncio":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ConfigurationError("the uvloop loop was asked for (--loop or OBSQ_LOOP), "
                                     "but uvloop is not installed: pip install "
                                     "'obsq[uvloop]', or choose auto or asyncio") from None
        return False
    return True


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """asyncio.run(main) on the loop `choice` names, in a process whose collector is paced
    for a worker (pace_collector)."""
    try:
        uvloop_chosen = uses_uvloop(choice)
    except ConfigurationError:
        main.close()  # never to run: no "never awaited" warning beside the error
        raise
    pace_collector()
    if uvloop_chosen:
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def pace_collector() -> None:
    """Every task allocates a few dozen short-lived containers (its Task, attempt, futures,
    the fetch's reply), so at Python's default pace the cyclic collector's youngest
    generation runs every few dozen tasks: 3 % of a no-op task's instructions (callgrind,
    tests/bench/instructions.py). What is already made (modules, the App) is frozen out of
    its sight, and, unless the process set its own thresholds, the youngest generation is
    collected every YOUNG_THRESHOLD allocations instead of 700."""
    gc.freeze()
    if gc.get_threshold() == PYTHON_THRESHOLDS:
        gc.set_threshold(YOUNG_THRESHOLD, *PYTHON_THRESHOLDS[1:])


def described(choice: str) -> str:
    """The running loop as a worker's start-up log names it, saying why it is not uvloop's
    when `choice` was auto and uvloop is not installed."""
    name = loop_name()
    # found, not imported: a worker that runs asyncio's loop does not spend uvloop's memory
    if name == "asyncio" and choice == "auto" and importlib.util.find_spec("uvloop") is None:
        return "asyncio (uvloop is not installed: pip install 'obsq[uvloop]' for a faster one)"
    return name


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """`uvloop 0.21.0` or `asyncio`: the running loop (or `loop`), as a start-up log says."""
    loop = loop or asyncio.get_running_loop()
    if type(loop).__module__.split(".")[0] == "uvloop":
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return "asyncio"
