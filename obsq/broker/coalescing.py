"""Concurrent producer calls share round trips.

A web app under load calls `enqueue` from many requests at once. While one enqueue of a
queue is on its way to Redis, the enqueues issued meanwhile wait together and go in the
next script call, so a burst of N concurrent calls costs a few round trips instead of N
(and a few connections instead of N). A lone call goes at once, on its own: nothing waits
for company. Each caller still gets its own statuses or its own error, and only after
Redis has its tasks. A caller's deadline covers its own wait; the shared round trips sent
on behalf of waiting callers get one of their own (`bound`), so a Redis that stopped
answering cannot hold a queue's lane for ever.

A queue is registered in the namespace's set of queues before its first task is written;
callers that see the same new queue at once share that one call too.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

from obsq.broker.records import Enqueued
from obsq.task import TaskMessage

Write = Callable[[str, list[TaskMessage]], Awaitable[list[Enqueued]]]
Bound = Callable[[Awaitable[list[Enqueued]]], Awaitable[list[Enqueued]]]
R = TypeVar("R")


class _Lane:
    """One queue's enqueues: whether a round trip is in flight, and who waits for the next."""

    __slots__ = ("busy", "flusher", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: deque[tuple[list[TaskMessage], asyncio.Future[list[Enqueued]]]] = deque()
        self.flusher: asyncio.Task[None] | None = None


class EnqueueCoalescer:
    """`enqueue(queue, messages)` with the calls made while one is in flight sent together.

    `write(queue, messages)` makes one script call of at most `batch` messages; `bound`
    puts a deadline on the round trips sent for waiting callers."""

    def __init__(self, write: Write, batch: int, bound: Bound) -> None:
        self._write = write
        self._batch = batch
        self._bound = bound
        self._lanes: dict[str, _Lane] = {}

    async def enqueue(self, queue: str, messages: list[TaskMessage]) -> list[Enqueued]:
        lane = self._lanes.get(queue)
        if lane is None:
            lane = self._lanes[queue] = _Lane()
        if lane.busy:
            future: asyncio.Future[list[Enqueued]] = asyncio.get_running_loop().create_future()
            lane.waiting.append((messages, future))
            return await future
        lane.busy = True  # nothing in flight: this call goes at once, in the caller's task
        try:
            return await self._write_all(queue, messages)
        finally:
            if lane.waiting:
                lane.flusher = asyncio.ensure_future(self._flush(queue, lane))
            else:
                lane.busy = False

    async def _write_all(self, queue: str, messages: list[TaskMessage]) -> list[Enqueued]:
        statuses: list[Enqueued] = []
        for start in range(0, len(messages), self._batch):
            statuses += await self._write(queue, messages[start:start + self._batch])
        return statuses

    async def _flush(self, queue: str, lane: _Lane) -> None:
        """Send what waits, a batch per round trip, until nothing does."""
        try:
            while lane.waiting:
                taken, size = [], 0
                while lane.waiting and size < self._batch:
                    messages, future = lane.waiting.popleft()
                    if not future.done():  # its caller gave up before it was sent
                        taken.append((messages, future))
                        size += len(messages)
                if taken:
                    await self._send(queue, taken)
        finally:
            for _, future in lane.waiting:  # left when the flusher was stopped
                future.cancel()
            lane.waiting.clear()
            lane.busy, lane.flusher = False, None

    async def _send(self, queue: str, taken: list[tuple[list[TaskMessage],
                                                         asyncio.Future[list[Enqueued]]]]
                    ) -> None:
        try:
            statuses = await self._bound(self._write_all(queue, [m for messages, _ in taken
                                                                 for m in messages]))
        except BaseException as exc:
            for _, future in taken:
                if not future.done():
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:
                        future.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for messages, future in taken:
            if not future.done():
                future.set_result(statuses[start:start + len(messages)])
            start += len(messages)

    async def close(self) -> None:
        """Stop sending: callers still waiting are cancelled."""
        flushers = [lane.flusher for lane in self._lanes.values() if lane.flusher]
        for flusher in flushers:
            flusher.cancel()
        await asyncio.gather(*flushers, return_exceptions=True)


class SharedCalls(Generic[R]):
    """Concurrent callers that need the same keys share one call per key: a key already
    under way is awaited, the rest go in one new call; `settled(keys, result)` is told of
    each call that succeeded."""

    def __init__(self, call: Callable[[set[str]], Awaitable[R]],
                 settled: Callable[[set[str], R], None]) -> None:
        self._call, self._settled = call, settled
        self._underway: dict[str, asyncio.Future[R]] = {}

    async def run(self, keys: set[str]) -> set[str]:
        """Wait for every key's call (this caller's failure too when it fails); returns the
        keys this caller's own call covered."""
        fresh = keys - self._underway.keys()
        if fresh:
            call = asyncio.ensure_future(self._call(fresh))
            for key in fresh:
                self._underway[key] = call
            call.add_done_callback(lambda done: self._done(fresh, done))
        calls = {self._underway[k] for k in keys if k in self._underway}
        if calls:
            await asyncio.wait(calls)  # a caller that gives up does not cancel the others'
        for call in calls:
            call.result()
        return fresh

    def _done(self, keys: set[str], call: asyncio.Future[R]) -> None:
        for key in keys:
            self._underway.pop(key, None)
        if not call.cancelled() and call.exception() is None:
            self._settled(keys, call.result())


REGISTER_AGAIN = 60.0  # seconds after which a producer registers a queue it writes to again


class QueueRegistry:
    """Queues this process has registered; concurrent first uses of one share the call. A
    queue is registered again REGISTER_AGAIN seconds later, at its next use: a Redis that
    restarted empty has it in its set again within a minute, where the sweeps, and workers
    looking for the partitions of another count, find its tasks."""

    def __init__(self, register: Callable[[set[str]], Awaitable[Any]],
                 now: Callable[[], float] = time.monotonic) -> None:
        self.known: dict[str, float] = {}  # queue -> when it was registered
        self._now = now
        self._calls: SharedCalls[Any] = SharedCalls(
            register, lambda queues, _: self.known.update(dict.fromkeys(queues, now())))

    def unregistered(self, queues: Iterable[str]) -> set[str]:
        """The queues not known yet, or not lately: those `ensure` registers. Asked before
        `ensure`, it spares an enqueue the await (and its CPU) when there are none."""
        stale = self._now() - REGISTER_AGAIN
        known = self.known
        return {q for q in queues if known.get(q, stale) <= stale}

    async def ensure(self, queues: Iterable[str]) -> set[str]:
        """Register the queues not known yet, or not lately; returns those this call
        registered itself."""
        new = self.unregistered(queues)
        return await self._calls.run(new) if new else new
