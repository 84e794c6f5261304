"""Where plain (sync) handlers run, so that one that overruns its timeout never starves the
tasks after it. Two pools, chosen by `WorkerSettings.pool` (`--pool`, OBSQ_POOL):

- `thread` (the default, `threads.py`): one thread per slot. A thread cannot be stopped,
  so a handler that overruns is told (`task.cancelled`) and keeps its thread and its slot,
  counted as stuck, until it returns; its attempt then ends with TaskTimeout.
- `process` (`processes.py`, the child's side in `child.py`): one child process per slot,
  which is killed and replaced when its handler overruns (a hard time limit), is
  cancelled, or crashes.

Both count a task's timeout from the moment its handler starts, not from its submission,
and end an attempt only once its handler has stopped: its retry never runs beside it.
Async handlers never come here: they run on the worker's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from obsq.engine.pools.base import HandlerPool
from obsq.engine.recycling import NO_RECYCLING, Recycling

if TYPE_CHECKING:
    from obsq.app import App


def make_pool(kind: str, size: int, app: App, on_stuck: Callable[[], None],
              recycling: Recycling = NO_RECYCLING) -> HandlerPool:
    """The pool named `kind` (one of settings.POOLS) with `size` slots; `on_stuck` is
    called on the event loop whenever the number of stuck slots changes; `recycling`: the
    limits of a process pool's children."""
    if kind == "process":
        from obsq.engine.pools.processes import ProcessSlots

        return ProcessSlots(size, app, recycling)
    from obsq.engine.pools.threads import ThreadSlots

    return ThreadSlots(size, on_stuck)
