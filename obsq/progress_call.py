"""How `task.update_state` reaches the worker's event loop from wherever a handler runs: an
async handler awaits the write on the loop itself; a plain one, in a thread of the worker,
cannot await, so its call hands the write to the loop and waits for it there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def written_from_here(write: Coroutine[Any, Any, None],
                      loop: asyncio.AbstractEventLoop | None) -> Awaitable[None]:
    """`write` for the caller to await when it runs on `loop` (or there is none to reach),
    else run on `loop` and waited for now, its result an awaitable already done."""
    if loop is None or running_loop() is loop:
        return write
    asyncio.run_coroutine_threadsafe(write, loop).result()
    return _Done()


class _Done:
    """The write is done: nothing warns when this is dropped, and awaiting it is harmless."""

    def __await__(self) -> Iterator[None]:
        return iter(())
