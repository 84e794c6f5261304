"""A worker's concurrency slots and the buffer of fetched tasks waiting for one: what its
fetch loop (obsq/engine/fetching.py) asks and hands over, and what starts next when a slot frees.

The fetcher asks `room()` how many tasks to fetch, `limits()` the route limits its fetch
applies, and hands what it took to `take()`; it waits on `freed` and stops on `stopped`.
Each task taken goes to a free slot, the buffer, or the suspects (obsq/engine/isolation.py: run
alone). A started task runs as `run(task)`, the worker's; it calls `ended()` when its
handler is done, which starts the next.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from obsq.broker import Broker, Fetched
from obsq.engine.isolation import Suspects
from obsq.settings import MAX_FETCH, PREFETCH_BELOW_SECONDS
from obsq.task import Task

PREFETCH_HORIZON = 0.01  # a prefetch buffer holds what the slots run in this long
BUFFER_HOLD = 1.0  # a buffered task waits this long at most while no slot frees


class Slots:
    def __init__(self, concurrency: int, broker: Broker, worker_id: str, *,
                 run: Callable[[Task], Coroutine[Any, Any, None]],
                 admit: Callable[[str, Fetched], Iterable[Task]],
                 limits: Callable[[int], bytes], deep: bool = True) -> None:
        """`admit(queue, fetched)`: the tasks of a fetch, built and counted as the worker's;
        `run(task)`: the coroutine that runs and settles one; `limits(partitions)`: limits.py's,
        for a queue of that many partitions. `deep`: the prefetch buffer may grow past one
        task a slot (not while weighted queues share the worker: a fetch takes from one
        queue, and a deep one would hold up the weights' turns; the partitions of one
        queue keep its priorities through dequeue.lua's rank floor)."""
        self.concurrency = concurrency
        self.deep = deep
        self.limits = limits
        self.busy = 0  # slots whose handler runs
        self.buffer: collections.deque[Task] = collections.deque()  # fetched, awaiting a slot
        self.suspects = Suspects(broker, worker_id, self.start_next)  # to run alone
        self.running: dict[asyncio.Task[None], Task] = {}  # started, until settled
        self.handling: set[asyncio.Task[None]] = set()  # started, until the handler ended
        self.freed = asyncio.Event()  # a slot freed: the fetcher may look again
        self.stopped = asyncio.Event()  # the worker stops: fetch no more
        self.draining = False  # start nothing more from the buffer
        # the loop its tasks run on, known from the first fetch taken (the slots may be
        # made before it runs); asyncio.create_task would look it up again for each task
        self.loop: asyncio.AbstractEventLoop | None = None
        self._run = run
        self._admit = admit
        self._recent_duration = PREFETCH_BELOW_SECONDS  # moving average of handler run time
        self._freed_at = time.monotonic()  # when a handler last ended
        self._held_back = False  # the buffer went back: fetch no more ahead until one ends

    def room(self) -> tuple[int, int]:
        """(tasks to fetch now, tasks an idle wait may take). While tasks are short the
        worker holds a buffer beside its slots and fetches only once a whole buffer's worth
        fits, so each round trip carries many tasks and the buffer keeps the slots fed
        meanwhile. The buffer holds what the slots run in PREFETCH_HORIZON, at least one
        task per slot and at most MAX_FETCH: a round trip's cost is spread over up to a
        hundred no-op tasks, while a task held back from other workers waits at most
        about that long."""
        if self.suspects.blocking:
            return 0, 0
        held = self.busy + len(self.buffer)
        duration = self._recent_duration
        if duration >= PREFETCH_BELOW_SECONDS or self._held_back:
            return self.concurrency - held, self.concurrency - self.busy
        if held > self.concurrency:
            return 0, self.concurrency - self.busy
        depth = self.concurrency  # one task a slot
        if self.deep:
            by_time = int(depth * PREFETCH_HORIZON / max(duration, 1e-6))
            depth = max(depth, min(by_time, MAX_FETCH))
        return self.concurrency + depth - held, self.concurrency - self.busy

    def take(self, queue: str, fetched: Fetched) -> None:
        """Start fetched tasks in free slots; the rest wait in the buffer (all of them once
        the worker is stopping: the drain hands the buffer back)."""
        fetched_at = time.monotonic()
        self.loop = asyncio.get_running_loop()
        may_start = not self.stopped.is_set()  # the same for each task of the fetch
        for task in self._admit(queue, fetched):
            if task.suspect:
                self.suspects.hold(task)
            elif may_start and self.busy < self.concurrency and not self.suspects.blocking:
                self.start(task)
            else:
                task.context["fetched_at"] = fetched_at
                self.buffer.append(task)
        self.start_next()

    def stuck(self) -> list[Task]:
        """The buffer's tasks, taken out, once no handler has ended for BUFFER_HOLD since
        the first of them was fetched: the handlers running now take far longer than those
        the buffer was sized by, and another worker may run these meanwhile. The worker
        then fetches nothing ahead until a handler ends."""
        if not self.buffer or self.hold_left() > 0:
            return []
        tasks = list(self.buffer)
        self.buffer.clear()
        self._held_back = True
        for task in tasks:
            task.context.pop("fetched_at", None)
        return tasks

    def hold_left(self) -> float:
        """How long until `stuck()` gives the buffer back (0: now; BUFFER_HOLD while
        nothing is buffered): how long the fetcher may wait for a slot to free."""
        if not self.buffer:
            return BUFFER_HOLD
        since = max(self._freed_at, self.buffer[0].context.get("fetched_at", 0.0))
        return max(BUFFER_HOLD - (time.monotonic() - since), 0.0)

    def start_next(self) -> None:
        """Fill free slots from the buffer, a suspect first (alone once no other task runs),
        and let the fetcher look again."""
        self.freed.set()
        if self.draining:
            return
        suspect = self.suspects.next_to_start(self.busy)
        if suspect is not None:
            self.start(suspect)
        while self.buffer and self.busy < self.concurrency and not self.suspects.blocking:
            self.start(self.buffer.popleft())

    def start(self, task: Task) -> None:
        fetched_at = task.context.pop("fetched_at", None)
        if fetched_at is not None:  # waited in the buffer too
            task.wait_seconds += time.monotonic() - fetched_at
        self.busy += 1
        runner = self.loop.create_task(self._run(task))  # type: ignore[union-attr]
        self.running[runner] = task
        self.handling.add(runner)

    def ended(self, runner: asyncio.Task[None], task: Task, seconds: float) -> None:
        """The handler of `task` is done after `seconds` (its outcome not yet settled)."""
        self.busy -= 1
        self._freed_at = time.monotonic()
        self._held_back = False
        self.handling.discard(runner)
        self.suspects.ended(task)
        self._recent_duration += (seconds - self._recent_duration) * 0.1
        self.start_next()

    def waiting(self, queue: str, task_id: str) -> Task | None:
        """The task, taken out of the buffer (or the suspects) if it waits there."""
        for waiting in (self.buffer, self.suspects.waiting):
            for task in waiting:
                if (task.id, task.kept_in) == (task_id, queue):
                    waiting.remove(task)
                    return task
        return None

    def unstarted(self) -> list[Task]:
        """Everything fetched and not started, taken out (for a drain to hand back)."""
        tasks = [*self.buffer, *self.suspects.take_all()]
        self.buffer.clear()
        return tasks
