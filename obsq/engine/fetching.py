"""Fetching: how a worker takes tasks from Redis, and which it starts. In the order of this
file: the fetch loop (`Fetcher`), the slots and prefetch buffer it fills (`Slots`), the
suspects that run alone (`Suspects`), the route limits each fetch applies (`RouteLimits`)
and the queues and partitions it serves (`ServedQueues`).

The fetch loop takes tasks as slots free up, in as few round trips as possible, and blocks
on Redis when there is nothing to do.

Busy: each fetch takes as many tasks as there is room for, in one script call, with the
completions gathered since the last round trip riding along (RidingAcks). While tasks
are short the worker holds up to twice its slots (a prefetch buffer) and fetches once a
whole batch fits. Idle: one BLPOP on the queues' wake lists, with the dequeue of the first
queue queued behind it on the same connection, so a task arrives in the round trip that
wakes the worker; a stop ends the wait through the worker's own wake list, so nothing the
fetch took is stranded. Every call ends within its deadline (the wait's: its length plus the
call deadline), so a connection the network dropped silently costs a retry on a fresh one,
and each round is marked (`FetchProgress`) for the watchdog and the probes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from obsq.app import App, PatternTable
from obsq.background import RedisRetry
from obsq.broker import Broker, Fetched
from obsq.engine.liveness import FetchProgress
from obsq.engine.settlement import Settler, attempt_of
from obsq.errors import BrokerError
from obsq.names import SEPARATOR, count_in_name, partition_names, queue_of, share
from obsq.settings import (
    ACK_LINGER,
    MAX_FETCH,
    PREFETCH_BELOW_SECONDS,
    REDIS_RETRY_MAX,
    STOP_WAIT,
    SWEEP_BATCH,
)
from obsq.task import Task

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
                 wait_timeout: float, progress: FetchProgress,
                 give_back: Callable[[list[Task]], Awaitable[None]]) -> None:
        """`slots` is what the fetcher asks (`Slots`, below): how many tasks to fetch now
        (0: wait for `slots.freed`) and how many an idle wait may take, the route limits
        each fetch applies, the tasks stuck in its buffer (handed to `give_back`); it takes
        what came, and `slots.stopped` ends the loop. `served`: the queues, their weights
        and their partitions (`ServedQueues`, below); `progress`: marked at each round."""
        self.give_back = give_back
        self.progress = progress
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
        # queues a fetch of which failed: Redis may have run it and leased tasks to this
        # worker whose reply never came; handed back before the next fetch (_hand_back_unread)
        self._unread: set[str] = set()

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
        try:
            await self._rounds()
        finally:
            self.progress.ended()

    async def _rounds(self) -> None:
        retry = RedisRetry("fetching tasks")
        slots = self.slots
        came_round = self.progress.came_round
        while not slots.stopped.is_set():
            came_round()
            try:
                if self._unread:
                    await self._hand_back_unread()
                stuck = slots.stuck()
                if stuck:
                    await self.give_back(stuck)
                wanted, _ = slots.room()
                if time.monotonic() >= self._refresh_at:  # partitions of another count
                    await self.served.refresh()
                    self._refresh_at = time.monotonic() + REFRESH
                if wanted <= 0:
                    slots.freed.clear()
                    await self.settler.acks.wait_for_room(slots.freed, ACK_LINGER,
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
        try:
            fetched = await self.settler.acks.ride(
                lambda completions, resent: self.broker.dequeue(
                    queue, count, self.worker_id, self.lease_seconds, completions, resent,
                    self.slots.limits(count_in_name(queue)), self._floor(queue)))
        except BrokerError:
            self._unread.add(queue)
            raise
        self.slots.take(queue, fetched)
        self._told(queue, fetched)
        return len(fetched.tasks)

    async def _wait_for_work(self) -> None:
        """Block on Redis until a producer signals a queue, with the fetch of the first queue
        riding behind the wait. Meanwhile completions of running tasks are sent on their
        own, and a stop interrupts the wait through the worker's own wake list."""
        slots = self.slots
        slots.freed.clear()
        if self.settler.acks.waiting.is_set():
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
                    await self.settler.acks.flush()
            if waiter.cancelled():  # abandoned on a stop (a Cluster's plain wait)
                return
            woken, fetched = await waiter
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.cancel()
            raise
        except BrokerError:
            self._unread.add(first)  # its dequeue rode the wait
            raise
        slots.take(first, fetched)
        self._told(first, fetched)
        if woken and not fetched.tasks:
            self._woken = woken
        await asyncio.sleep(0)  # let the handlers just started begin before the next fetch

    async def _hand_back_unread(self) -> None:
        """A fetch failed (its deadline fired, its connection dropped) after Redis may have
        run it: the tasks it leased to this worker would wait for their lease to run out.
        Once Redis answers again, before the next fetch (none is under way, so every task
        this worker has read is among its claims), those it does not hold go back to the
        head of their queue."""
        held = self.settler.claims.by_queue()
        for queue in sorted(self._unread):
            released = await self.broker.release_unheld(queue, held.get(queue, []),
                                                        self.worker_id, SWEEP_BATCH)
            self._unread.discard(queue)
            if released:
                log.info("worker %s handed %d task(s) back to queue %s that a fetch took "
                         "whose reply was lost", self.worker_id, released, queue)

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


# -- slots and the prefetch buffer ------------------------------------------------------------
# The fetcher asks `room()` how many tasks to fetch, `limits()` the route limits its fetch
# applies, and hands what it took to `take()`; it waits on `freed` and stops on `stopped`.
# Each task taken goes to a free slot, the buffer, or the suspects. A started task runs as
# `run(task)`, the worker's; it calls `ended()` when its handler is done, which starts the
# next.

PREFETCH_HORIZON = 0.01  # a prefetch buffer holds what the slots run in this long
BUFFER_HOLD = 1.0  # a buffered task waits this long at most while no slot frees


class Slots:
    def __init__(self, concurrency: int, broker: Broker, worker_id: str, *,
                 run: Callable[[Task], Coroutine[Any, Any, None]],
                 admit: Callable[[str, Fetched], Iterable[Task]],
                 limits: Callable[[int], bytes], deep: bool = True) -> None:
        """`admit(queue, fetched)`: the tasks of a fetch, built and counted as the worker's;
        `run(task)`: the coroutine that runs and settles one; `limits(partitions)`: RouteLimits',
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
            if task._attempt.suspect:
                self.suspects.hold(task)
            elif may_start and self.busy < self.concurrency and not self.suspects.blocking:
                self.start(task)
            else:
                task._attempt.fetched_at = fetched_at
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
            task._attempt.fetched_at = None
        return tasks

    def hold_left(self) -> float:
        """How long until `stuck()` gives the buffer back (0: now; BUFFER_HOLD while
        nothing is buffered): how long the fetcher may wait for a slot to free."""
        if not self.buffer:
            return BUFFER_HOLD
        since = max(self._freed_at, self.buffer[0]._attempt.fetched_at or 0.0)
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
        fetched_at, task._attempt.fetched_at = task._attempt.fetched_at, None
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

    def settled(self, runner: asyncio.Task[None]) -> None:
        """The task `runner` ran is settled (or left for the drain to hand back): it no
        longer counts as running."""
        del self.running[runner]

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


log = logging.getLogger("obsq")
# -- suspects run alone -------------------------------------------------------------------
# A worker killed by one of its handlers (os._exit, a native crash, an OOM kill) takes every
# task it ran down with it, and Redis cannot tell which one did it: the recoverer makes them
# all suspects without counting the loss against any of them. The worker that takes a
# suspect fetches and starts nothing more until its other tasks are done, then records in
# Redis that this attempt runs alone and runs it with no task beside it; a loss during that
# run is the suspect's own, and only such losses count against max_recoveries
# (recover.lua). A suspect whose worker's tasks do not end within SUSPECT_WAIT runs beside
# them instead, unmarked: its loss then counts against no task.

SUSPECT_WAIT = 5.0  # seconds a suspect waits for the other tasks of its worker to end


class Suspects:
    def __init__(self, broker: Broker, worker_id: str, recheck: Callable[[], None],
                 wait: float = SUSPECT_WAIT) -> None:
        """`recheck()` is called when the first waiting suspect has waited `wait`."""
        self.broker = broker
        self.worker_id = worker_id
        self.recheck = recheck
        self.wait = wait
        self.waiting: collections.deque[Task] = collections.deque()  # fetched, not started
        self.alone: Task | None = None  # the suspect running alone now
        self._since = 0.0  # when the first waiting suspect began to wait

    @property
    def blocking(self) -> bool:
        """While a suspect waits or runs alone, the worker starts and fetches no other task."""
        return bool(self.waiting) or self.alone is not None

    def hold(self, task: Task) -> None:
        task._attempt.fetched_at = time.monotonic()  # its wait counts from now (Slots.start)
        if not self.waiting:
            self._wait_from_now()
        self.waiting.append(task)

    def next_to_start(self, busy: int) -> Task | None:
        """The suspect to start now: alone once no other task runs, else beside the others
        once it has waited too long."""
        if self.alone is not None or not self.waiting:
            return None
        if busy == 0:
            task = self.alone = self.waiting.popleft()
        elif time.monotonic() - self._since >= self.wait:
            task = self.waiting.popleft()
            task._attempt.suspect = False  # unmarked: a loss of this run is not its own
            log.info("suspect task %s (%s) runs beside %d other task(s): they did not end "
                     "within %g s", task.id, task.type, busy, self.wait)
        else:
            return None
        if self.waiting:
            self._wait_from_now()
        return task

    def _wait_from_now(self) -> None:
        self._since = time.monotonic()
        asyncio.get_running_loop().call_later(self.wait, self.recheck)

    def ended(self, task: Task) -> None:
        if task is self.alone:
            self.alone = None

    def take_all(self) -> list[Task]:
        """The waiting suspects, for a draining worker to hand back."""
        tasks = list(self.waiting)
        self.waiting.clear()
        return tasks

    async def start_alone(self, task: Task) -> bool:
        """Record that `task` runs alone; False when its lease was taken over meanwhile.
        Retried while Redis is away: an unmarked run could not be told from a shared one.
        A full Redis refuses the mark: the task then runs unmarked (its loss uncounted),
        as this worker's runs are what drain Redis."""
        retry = RedisRetry("marking a suspect that runs alone")
        while True:
            try:
                return await self.broker.isolate(task.kept_in, attempt_of(task), self.worker_id)
            except BrokerError as exc:
                if exc.out_of_memory:
                    return True
                await asyncio.sleep(retry.failed(exc))


# A cell-rate limit lets a start come early by this many intervals: a burst of two, so
# that the starts of any one-second window stay within the rate plus one.
# -- route limits -------------------------------------------------------------------------
# The App's (`@app.task(..., concurrency=3, rate_limit="100/s")`, counted in Redis across
# every worker) and the worker's own (`route_concurrency={"pdf:": 5}`, counted here).
# dequeue.lua checks them as it takes each task and sets aside what may not start yet, so
# a limited route never takes a slot of the worker nor blocks the routes behind it.

RATE_TOLERANCE = 1.0

# a route's limits as dequeue.lua reads them: pattern, concurrency, rate (ms between starts,
# ms early), and the same per fairness key
Share = tuple[str, int, float, float, int, float, float]


def _rate_ms(rate: float | None) -> tuple[float, float]:
    """dequeue.lua's form of a rate limit: ms between starts and the ms a start may come
    early (0, 0: none)."""
    return (1000 / rate, RATE_TOLERANCE * 1000 / rate) if rate else (0, 0)


class RouteLimits:
    def __init__(self, app: App, route_concurrency: dict[str, int] | None) -> None:
        self._shared: list[Share] = [
            (r.pattern, r.concurrency or 0, *_rate_ms(r.rate), r.key_concurrency or 0,
             *_rate_ms(r.key_rate))
            for r in app.routes if r.concurrency or r.rate or r.key_concurrency or r.key_rate]
        self._own: PatternTable[str] = PatternTable()
        self._own_limits = dict(route_concurrency or {})
        for pattern in self._own_limits:
            self._own.add(pattern, pattern)
        self._taken: Counter[str] = Counter()  # this worker's attempts per own pattern
        self._by_count: dict[int, list[Share]] = {}  # the shares per partition count

    def encoded(self, partitions: int = 1) -> bytes:
        """What dequeue.lua takes for a queue of `partitions` partitions: b"" when there is
        no limit at all (its fast path). Each partition keeps its share of the App's limits
        (counted in its own keys): a concurrency limit C as ceil(C/N), at least 1, so at most
        C + N - 1 run at once; a rate as rate/N, the whole rate while the route's tasks
        spread over the partitions. The worker's own limits are its own, whole."""
        if not self._shared and not self._own_limits:
            return b""
        own = [[p, limit - self._taken[p]] for p, limit in self._own_limits.items()]
        return orjson.dumps({"g": self._shares(partitions), "l": own})

    def _shares(self, partitions: int) -> list[Share]:
        if partitions == 1:
            return self._shared
        shares = self._by_count.get(partitions)
        if shares is None:
            shares = self._by_count[partitions] = [
                (pattern, share(limit, partitions) if limit else 0, interval * partitions,
                 tolerance * partitions, share(key_limit, partitions) if key_limit else 0,
                 key_interval * partitions, key_tolerance * partitions)
                for pattern, limit, interval, tolerance, key_limit, key_interval, key_tolerance
                in self._shared]
        return shares

    def took(self, task: Task) -> None:
        """A task this worker took (running, or waiting in its buffer) counts under its own
        limit until released."""
        pattern = self._own.match(task.type)
        if pattern is not None:
            self._taken[pattern] += 1
            task._attempt.own_limit = pattern

    def released(self, task: Task) -> None:
        pattern, task._attempt.own_limit = task._attempt.own_limit, None
        if pattern is not None:
            self._taken[pattern] -= 1



# -- the queues served ----------------------------------------------------------------------
# Each queue's partitions (obsq/names.py) by its App's count (`app.queue`), else by the
# count its other workers wrote to Redis; and the partitions of an earlier count while they
# hold tasks, so a change of the count drains them. Refreshed every REFRESH seconds: a
# producer that has not heard of a new count (or an old version of the app) may still
# write to the earlier partitions.

REFRESH = 10.0  # seconds between two looks at the partitions in Redis
LIVE_STATES = ("pending", "active", "scheduled", "retry", "aggregating")


class ServedQueues:
    def __init__(self, broker: Broker, weights: dict[str, int],
                 declared: dict[str, int]) -> None:
        """`weights`: the queues served and their weights; `declared`: the App's partition
        counts (app.partitions)."""
        self.broker = broker
        self.weights = weights
        self.declared = {q: n for q, n in declared.items() if q in weights}  # the App's
        # each queue's partitions served now, its current ones first
        self.partitions: dict[str, list[str]] = {q: [q] for q in weights}
        # every partition served, one list shared with the loops that read it at each pass
        self.names: list[str] = list(weights)

    async def refresh(self) -> None:
        """Look again (at start, then every REFRESH seconds). The App's counts reach Redis
        with each heartbeat (broker/upkeep.py)."""
        counts = dict(self.declared)
        undeclared = [q for q in self.weights if q not in counts]
        if undeclared:
            counts.update(await self.broker.partition_counts(undeclared))
        current = {q: list(partition_names(q, counts[q])) for q in self.weights}
        earlier = [name for name in await self.broker.queues() if queue_of(name) in current
                   and name not in current[queue_of(name)]]
        if earlier:
            stats = await self.broker.queue_stats(earlier)
            for name in earlier:
                if any(stats[name].depth[state] for state in LIVE_STATES):
                    current[queue_of(name)].append(name)
        self.partitions = current
        self.names[:] = [name for names in current.values() for name in names]
