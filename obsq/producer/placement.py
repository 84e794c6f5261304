"""Where a producer writes each task: the partition of its queue (obsq/names.py).

A queue's partition count is the App's (`app.queue`) when the producer has the App, else
what the queue's workers wrote to Redis; that is read again after LOOKUP_TTL, so a change
of the count reaches producers without the App within seconds. Until it does they write
to the previous partitions, which workers go on draining: nothing waits for good.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from obsq.broker.coalescing import SharedCalls
from obsq.names import SEPARATOR, choose, partition_names, placement_key, queue_of
from obsq.task import TaskMessage

if TYPE_CHECKING:
    from obsq.broker import Broker

LOOKUP_TTL = 10.0  # seconds a partition count read from Redis is used
NEVER_READ = (1, float("-inf"))  # a queue's (count, read at) before its count is read


class Placement:
    def __init__(self, broker: Broker, declared: dict[str, int],
                 read_counts: Callable[[set[str]], Awaitable[dict[str, int]]],
                 now: Callable[[], float] = time.monotonic) -> None:
        """`declared`: the App's counts (app.partitions, read at each enqueue, so a queue
        declared after the Client was made counts too); `read_counts`: the Client's read of
        the counts its workers wrote to Redis."""
        self.broker = broker
        self._declared = declared
        self._learned: dict[str, tuple[int, float]] = {}  # queue -> (count, read at)
        # concurrent callers needing a new queue's count share one read
        self._reads = SharedCalls(read_counts, lambda _, counts: self.learn(counts))
        self._now = now

    async def read(self, unknown: list[str]) -> None:
        """Read from Redis the counts of `unknown` (as unknown() named them)."""
        if unknown:
            await self._reads.run(set(unknown))

    async def locate(self, task_id: str, queue: str | None) -> str | None:
        """The queue or partition holding `task_id` in `queue` (None: in any queue). In a
        partitioned queue the partition its id chooses is looked at first (a task without
        an ordering, unique or group key is there), then the others; then the queue's
        partitions of any count known to Redis (an earlier count, or one no worker has
        written yet). Found nowhere: `queue` itself (its caller reads no task there), or None
        when no queue was named."""
        if queue is None:
            return await self.broker.find_queue(task_id)
        if SEPARATOR in queue:
            return queue
        await self.read(self.unknown([queue]))
        names = partition_names(queue, self.count(queue))
        first = choose(names, task_id)
        found = await self.broker.find_queue(task_id, [first, *(n for n in names
                                                                 if n != first)])
        if found is None:
            found = await self.broker.find_queue(task_id, [
                q for q in await self.broker.queues() if queue_of(q) == queue
                and q not in names])
        return found or queue

    def unknown(self, queues: Iterable[str]) -> list[str]:
        """Those of `queues` whose count must be read from Redis first."""
        stale = self._now() - LOOKUP_TTL
        declared, learned = self._declared, self._learned
        return sorted({q for q in queues if q not in declared and SEPARATOR not in q
                       and learned.get(q, NEVER_READ)[1] <= stale})

    def learn(self, counts: dict[str, int]) -> None:
        now = self._now()
        self._learned.update((queue, (count, now)) for queue, count in counts.items())

    def count(self, queue: str) -> int:
        return self._declared.get(queue) or self._learned.get(queue, (1, 0.0))[0]

    def assign(self, messages: Iterable[TaskMessage], group: str = "") -> None:
        """Set each message's partition by the counts known (a partition's name given as
        the queue is kept: an operator may address one partition). `group`: the grouped
        tasks' group, which must stay in one partition with its batch."""
        partitions_of: dict[str, tuple[str, ...]] = {}  # each queue's, looked up once
        for m in messages:
            if m.partition:
                continue
            names = partitions_of.get(m.queue)
            if names is None:
                names = partitions_of[m.queue] = () if SEPARATOR in m.queue else \
                    partition_names(m.queue, self.count(m.queue))
            if len(names) > 1:
                m.partition = choose(names, placement_key(
                    m.id, m.ordering_key, m.unique_key, group and f"{m.type} {group}"))
            elif not names:
                m.partition, m.queue = m.queue, queue_of(m.queue)
