"""A worker's fetch loop: take tasks from Redis as slots free up, in as few round trips as
possible, and block on Redis when there is nothing to do.

Busy: each fetch takes as many tasks as there is room for, in one script call, with the
completions gathered since the last round trip riding along (Settler.riding). While tasks
are short the worker holds up to twice its slots (a prefetch buffer) and fetches once a
whole batch fits. Idle: one BLPOP on the queues' wake lists, with the dequeue of the first
queue queued behind it on the same connection, so a task arrives in the round trip that
wakes the worker; a stop ends the wait through the worker's own wake list, so nothing the
fetch took is stranded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from obsq.broker import Broker, Fetched
from obsq.engine.serving import REFRESH, ServedQueues
from obsq.engine.settlement import Settler
from obsq.engine.slots import Slots
from obsq.errors import BrokerError
from obsq.loop import RedisRetry
from obsq.partitions import SEPARATOR, count_in_name, queue_of
from obsq.settings import ACK_LINGER, MAX_FETCH, REDIS_RETRY_MAX, STOP_WAIT

if TYPE_CHECKING:
    from obsq.task import Task

log = logging.getLogger("obsq")
AHEAD_FOR = 1.0  # seconds a partition's best rank is trusted before it is fetched first again
# uvloop's timers count whole milliseconds and may end a wait up to one early: a wait for a
# buffer's hold to end lasts this much longer, so that it ends after the hold, not a hold later
TIMER_SLACK = 0.005


class Fetcher:
    def __init__(self, broker: Broker, settler: Settler, worker_id: str, slots: Slots, *,
                 served: ServedQueues, strict_priority: bool, lease_seconds: float,
                 wait_timeout: float,
                 give_back: Callable[[list[Task]], Awaitable[None]]) -> None:
        """`slots` is what the fetcher asks (obsq/engine/slots.py): how many tasks to fetch now
        (0: wait for `slots.freed`) and how many an idle wait may take, the route limits
        each fetch applies, the tasks stuck in its buffer (handed to `give_back`); it takes
        what came, and `slots.stopped` ends the loop. `served`: the queues, their weights
        and their partitions (obsq/engine/serving.py)."""
        self.give_back = give_back
        self.broker = broker
        self.settler = settler
        self.worker_id = worker_id
        self.slots = slots
        self.served = served
        self.strict_priority = strict_priority
        self.lease_seconds = lease_seconds
        self.wait_timeout = wait_timeout
        weights = served.weights
        self._order = sorted(weights, key=lambda q: -weights[q])
        self._turn = 0  # which partition of each queue comes first, in turn
        self._woken: str | None = None  # a partition an idle wait heard of: fetched first
        # partition -> (the rank of its best task left, ms; inf: none; when it was told)
        self._ahead: dict[str, tuple[float, float]] = {}
        self._refresh_at = time.monotonic() + REFRESH  # the worker's start looked just now

    def queue_order(self) -> list[str]:
        """The partitions to fetch from, in order. Queues: strict, by weight; weighted, a
        random order, each queue first in proportion to its weight, so low-weight queues
        are never starved. A queue's partitions: by the rank of the best task each had left
        at its last fetch (due - priority * aging, as dequeue.lua ranks a queue's tasks), so
        the queue's best tasks go first across its partitions; one not fetched for AHEAD_FOR
        seconds first of all (its rank may have changed), in turn."""
        order = self._order
        if not self.strict_priority and len(order) > 1:
            names, weights, order = list(order), [self.served.weights[q] for q in order], []
            while names:
                i = random.choices(range(len(names)), weights)[0]
                order.append(names.pop(i))
                weights.pop(i)
        self._turn += 1
        partitions = self.served.partitions
        if len(partitions) == len(self.served.names):  # no queue is partitioned
            return order
        names = [name for queue in order for name in self._by_rank(partitions[queue])]
        woken, self._woken = self._woken, None
        if woken in names:  # the wait was woken by this one, and its dequeue rode another
            names.remove(woken)
            names.insert(0, woken)
        return names

    def _by_rank(self, names: list[str]) -> list[str]:
        now = time.monotonic()
        unknown, known = [], []
        for turn, name in enumerate(_rotated(names, self._turn)):
            seen = self._ahead.get(name)
            if seen is None or now - seen[1] >= AHEAD_FOR:
                unknown.append(name)
            else:
                known.append((seen[0], turn, name))
        return unknown + [name for _, _, name in sorted(known)]

    def _floor(self, partition: str) -> int | None:
        """The best rank the other partitions of its queue were told to hold (within
        AHEAD_FOR): a fetch of `partition` stops before a task ranked after it, so a batch
        does not take this partition's lower priorities ahead of another's higher."""
        if SEPARATOR not in partition:
            return None
        now, queue = time.monotonic(), queue_of(partition)
        ranks = [rank for name, (rank, told) in self._ahead.items()
                 if name != partition and queue_of(name) == queue
                 and now - told < AHEAD_FOR and rank != math.inf]
        return int(min(ranks)) if ranks else None

    def _told(self, queue: str, fetched: Fetched) -> None:
        """Keep what a partition's fetch said of its best task left (not a plain wait's, nor
        a paused partition's: it says nothing of the tasks it holds)."""
        if SEPARATOR in queue and fetched.asked_at and fetched.now_ms:
            self._ahead[queue] = (math.inf if fetched.ahead_ms is None else fetched.ahead_ms,
                                  time.monotonic())

    async def run(self) -> None:
        """Fetch until the worker stops; Redis errors are retried with backoff."""
        retry = RedisRetry("fetching tasks")
        slots = self.slots
        while not slots.stopped.is_set():
            try:
                stuck = slots.stuck()
                if stuck:
                    await self.give_back(stuck)
                wanted, _ = slots.room()
                if time.monotonic() >= self._refresh_at:  # partitions of another count
                    await self.served.refresh()
                    self._refresh_at = time.monotonic() + REFRESH
                if wanted <= 0:
                    slots.freed.clear()
                    await self.settler.wait_carrying(slots.freed, ACK_LINGER,
                                                     slots.hold_left() + TIMER_SLACK)
                    continue
                got = 0
                for queue in self.queue_order():
                    got += await self._fetch(queue, min(wanted - got, MAX_FETCH))
                    if got >= wanted:
                        break
                retry.succeeded()
                if not got:
                    await self._wait_for_work()
            except BrokerError as exc:  # the next try soon: a restarted Redis is back in ms
                await self._pause(retry.failed(exc))
            except Exception:
                log.exception("fetching tasks failed; retrying")  # never let the loop die
                await self._pause(REDIS_RETRY_MAX)

    async def _fetch(self, queue: str, count: int) -> int:
        """Take up to `count` tasks of `queue`; the completions gathered so far ride along."""
        fetched = await self.settler.riding(lambda completions, resent: self.broker.dequeue(
            queue, count, self.worker_id, self.lease_seconds, completions, resent,
            self.slots.limits(count_in_name(queue)), self._floor(queue)))
        self.slots.take(queue, fetched)
        self._told(queue, fetched)
        return len(fetched.tasks)

    async def _wait_for_work(self) -> None:
        """Block on Redis until a producer signals a queue, with the fetch of the first queue
        riding behind the wait. Meanwhile completions of running tasks are sent on their
        own, and a stop interrupts the wait through the worker's own wake list."""
        slots = self.slots
        slots.freed.clear()
        if self.settler.acks_waiting.is_set():
            return  # the next fetch carries them
        first = self.queue_order()[0]
        waiter = asyncio.ensure_future(self.broker.wait_and_dequeue(
            list(self.served.names), self.wait_timeout, first, min(slots.room()[1], MAX_FETCH),
            self.worker_id, self.lease_seconds, slots.limits(count_in_name(first))))
        interrupted = False
        try:
            while not waiter.done():
                events = [] if interrupted else [asyncio.ensure_future(e.wait())
                                                 for e in (slots.stopped, slots.freed)]
                await asyncio.wait([waiter, *events], return_when=asyncio.FIRST_COMPLETED,
                                   timeout=STOP_WAIT if interrupted else None)
                for event in events:
                    event.cancel()
                if waiter.done():
                    break
                if interrupted:  # Redis did not answer the interruption: give up the wait
                    _abandon(waiter)
                    return
                if slots.stopped.is_set():
                    interrupted = True
                    await self._interrupt(waiter)
                    continue
                slots.freed.clear()
                with contextlib.suppress(BrokerError):  # kept for the next try
                    await self.settler.flush()
            if waiter.cancelled():  # abandoned on a stop (a Cluster's plain wait)
                return
            woken, fetched = await waiter
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.cancel()
            raise
        slots.take(first, fetched)
        self._told(first, fetched)
        if woken and not fetched.tasks:
            self._woken = woken
        await asyncio.sleep(0)  # let the handlers just started begin before the next fetch

    async def _interrupt(self, waiter: asyncio.Future[Any]) -> None:
        if self.broker.is_cluster:
            _abandon(waiter)  # a plain wait: nothing rides behind it
            return
        try:
            await self.broker.interrupt_wait(self.worker_id)
        except BrokerError:
            _abandon(waiter)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.slots.stopped.wait(), timeout=seconds)


def _rotated(names: list[str], turn: int) -> list[str]:
    start = turn % len(names)
    return names[start:] + names[:start]


def _abandon(waiter: asyncio.Future[Any]) -> None:
    """Cancel a wait nobody will await, and consume its outcome so asyncio does not log it
    (redis-py may finish a cancelled BLPOP only at its timeout)."""
    waiter.cancel()
    waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
