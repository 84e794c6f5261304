"""One enqueue, whichever transport writes it: the Client's event loop (each queue's group
through the EnqueueCoalescer) or the SyncClient's caller thread (through the
BlockingProducer). Both ask this step the same things in the same order: the jobs checked
and encoded (`prepare`), the plan when every partition count is known (`plan_known`, most
enqueues), else the counts to read (`to_read`) and then each message placed and the
messages grouped by queue (`plan`: one script call writes one queue's); and the TaskInfos
in the caller's order from the statuses Redis replied (`EnqueuePlan.answer`).
Only the Redis calls between are the transport's, so the two cannot drift apart. Flows
and grouped enqueues use the same preparation and placement.

In the order of this file: the step and its plan; where each task goes (`Placement`: the
partition of its queue); the producer hooks composed around a write (`ProducerChain`); and
concurrent calls sharing round trips (`EnqueueCoalescer`, `QueueRegistry`)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from obsq.app import CATCH_ALL, App, CallNextProducer, Hooks, ProducerHook, is_prefix
from obsq.broker import Broker, Enqueued
from obsq.errors import BrokerTimeout, DuplicateTask, UnknownTaskType
from obsq.names import SEPARATOR, choose, partition_names, placement_key, queue_of
from obsq.settings import MAX_PAYLOAD_BYTES
from obsq.task import Job, TaskInfo, TaskMessage, build_message


class JobChecks:
    """The first step of an enqueue, which needs no Redis: `app` gives each route's
    defaults and the types it runs, `refusal_hooks` (the producer's, after the App's) hear
    of each job refused. The transactional outbox (obsq.outbox) checks its rows with it."""

    def __init__(self, app: App | None, refusal_hooks: Hooks[[Job, Exception]]) -> None:
        self.app = app
        self.refusal_hooks = refusal_hooks

    def prepare(self, jobs: Sequence[Job], now: float, check_types: bool = True,
                group: bool = False) -> list[TaskMessage]:
        """The jobs checked and encoded at `now`: ValueError or TypeError for the first
        refused, then (`check_types`) UnknownTaskType naming every type the App cannot run;
        each refusal told to the refusal hooks. `group`: grouped tasks, whose aggregator
        runs, not a handler."""
        messages = ([self._message(jobs[0], now)] if len(jobs) == 1  # most: no comprehension
                    else [self._message(job, now) for job in jobs])
        if check_types and self.app is not None:
            self._refuse_unknown_types(self.app, jobs, group)
        return messages

    def _message(self, job: Job, now: float) -> TaskMessage:
        """The job checked and encoded with its route's defaults (a job given by its handler
        has its route without the App); a refusal is told to the refusal hooks."""
        app = self.app
        try:
            route = app.route(job.type) if app is not None else None
            if route is None and job.registration is not None:
                route = job.registration.route
            if route is None:
                return build_message(job, now=now, max_payload=app.max_payload if app
                                     is not None else MAX_PAYLOAD_BYTES)
            fairness_key = None
            if route.fairness_key is not None and job.fairness_key is None:
                fairness_key = route.fairness_key(job.payload)
            return build_message(job, queue=route.queue, max_retry=route.max_retry,
                                 timeout=route.timeout, now=now, priority=route.priority,
                                 max_payload=app.max_payload_of(route) if app is not None
                                 else route.max_payload or MAX_PAYLOAD_BYTES,
                                 declared=route.declared, expires=route.expires,
                                 debounce=route.debounce, debounce_max=route.debounce_max,
                                 fairness_key=fairness_key)
        except (ValueError, TypeError) as exc:
            if app is not None:
                app.refusal_hooks(job, exc)
            self.refusal_hooks(job, exc)
            raise

    def _refuse_unknown_types(self, app: App, jobs: Sequence[Job], group: bool) -> None:
        """A typo in a type would show only as tasks handed on for a day (a flow's step
        waiting with them), or grouped tasks waiting for good: the jobs are refused whole,
        before anything is written, when the App runs none of their type. Registered means
        routed (`app.route`, prefixes and '*' too), or for grouped tasks aggregated; an App
        with no handler at all is only a producer's (its namespace, its hooks) and refuses
        nothing."""
        find = app.aggregation if group else app.route
        unknown: list[str] = []
        for job in jobs:  # a loop: most enqueues find none (a comprehension is a call)
            if find(job.type) is None and job.type not in unknown:
                unknown.append(job.type)
        if not unknown or not app.routes:
            return
        error = UnknownTaskType(unknown_types_text(app, unknown, group))
        for job in jobs:
            if job.type in unknown:
                app.refusal_hooks(job, error)
                self.refusal_hooks(job, error)
        raise error


class EnqueueStep(JobChecks):
    """A producer's enqueue without its Redis calls: the jobs checked (JobChecks), then
    placed in their queues' partitions."""

    def __init__(self, app: App | None, placement: Placement,
                 refusal_hooks: Hooks[[Job, Exception]]) -> None:
        super().__init__(app, refusal_hooks)
        self.placement = placement

    def to_read(self, messages: Iterable[TaskMessage]) -> list[str]:
        """The queues whose partition counts the transport reads from Redis before `plan`."""
        return self.placement.unknown([m.queue for m in messages if not m.partition])

    def plan_known(self, messages: list[TaskMessage]) -> EnqueuePlan | None:
        """`plan` when every count it needs is known (None: `to_read` names some to read
        first); one message, most enqueues, placed in one step."""
        if len(messages) != 1:
            return None if self.to_read(messages) else self.plan(messages, {})
        m = messages[0]
        if not m.partition:
            placement = self.placement
            names = placement.partitions(m.queue, placement.stale())
            if names is None:
                return None
            placement.place(m, names)
        return EnqueuePlan(messages, {m.partition or m.queue: messages})

    def plan(self, messages: list[TaskMessage], counts: dict[str, int],
             group: str = "") -> EnqueuePlan:
        """Each message placed in its partition (`counts`: those `to_read` named, as read),
        and the messages grouped by queue. `group`: grouped tasks' group, kept in one
        partition."""
        if counts:
            self.placement.learn(counts)
        self.placement.assign(messages, group)
        if len(messages) == 1:  # most enqueues: one task, one queue
            m = messages[0]
            return EnqueuePlan(messages, {m.partition or m.queue: messages})
        return EnqueuePlan(messages, group_by_queue(messages))


def unknown_types_text(app: App, types: list[str], group: bool) -> str:
    """What a Client with the App says of types it runs none of: each type, with the
    registered type closest to it when one is close."""
    if group:
        what, patterns = "aggregator (app.aggregate)", [a.pattern for a in app.aggregations]
    else:
        what, patterns = "handler (app.task)", [r.pattern for r in app.routes]
    named = []
    for task_type in types:
        close = closest_type(task_type, patterns)
        named.append(f"{task_type!r}" + (f" (did you mean {close!r}?)" if close else ""))
    listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    return (f"task type{'s' if len(named) > 1 else ''} {listed} "
            f"{'has' if len(named) == 1 else 'have'} no {what} in the App of this Client: "
            "nothing was enqueued")


def closest_type(task_type: str, patterns: Iterable[str]) -> str | None:
    """The registered type most like `task_type`, if one is close: an exact pattern, or a
    type a prefix pattern covers (the prefix in place of as many leading characters)."""
    import difflib  # here, not at the top: only a refused type needs it

    candidates = [p + task_type[len(p):] if is_prefix(p) else p
                  for p in patterns if p != CATCH_ALL]
    found = difflib.get_close_matches(task_type, candidates, n=1)
    return found[0] if found else None


class EnqueuePlan:
    """An enqueue's messages, placed, and grouped by the queue (or partition) each goes to."""

    __slots__ = ("groups", "messages")

    def __init__(self, messages: list[TaskMessage],
                 groups: dict[str, list[TaskMessage]]) -> None:
        self.messages = messages
        self.groups = groups

    def answer(self, replies: Sequence[list[Enqueued]]) -> list[TaskInfo]:
        """The TaskInfos in the order of the messages, from each group's statuses (in the
        order of `groups`)."""
        if len(replies) == 1:
            return list(map(info_after_enqueue, self.messages, replies[0]))
        statuses: dict[int, Enqueued] = {}  # by message object: two jobs may share a task_id
        for group, reply in zip(self.groups.values(), replies):
            statuses.update((id(m), status) for m, status in zip(group, reply))
        return [info_after_enqueue(m, statuses[id(m)]) for m in self.messages]


def group_by_queue(messages: list[TaskMessage]) -> dict[str, list[TaskMessage]]:
    """The messages of each queue (or partition), in their order: one script call writes
    one queue's."""
    by_queue: dict[str, list[TaskMessage]] = {}
    for m in messages:
        by_queue.setdefault(m.partition or m.queue, []).append(m)
    return by_queue


def unless_duplicate(info: TaskInfo) -> TaskInfo:
    """`enqueue` of one task raises what `enqueue_many` reports as `duplicate`."""
    if info.duplicate:
        raise DuplicateTask(f"task {info.type!r} is a duplicate of {info.id}", info.id)
    return info


def info_after_enqueue(m: TaskMessage, status: Enqueued) -> TaskInfo:
    """A debounced enqueue that replaced the waiting task of its key (`debounced`) names
    that task: not created, yet no duplicate."""
    # by position, in TaskInfo's field order (keywords cost each enqueue 0.3 µs more)
    return TaskInfo(status.existing_id or m.id, m.type, m.queue,
                    "scheduled" if m.delay > 0 else "pending", 0, m.priority, m.max_retry,
                    None, None, None, None, m.headers, None, None, None,
                    not (status.created or status.debounced), status.debounced, m.partition,
                    m.result_type)


def info_after_grouping(m: TaskMessage, status: Enqueued) -> TaskInfo:
    """A grouped task waits in its group (state `aggregating`) for its aggregator."""
    return TaskInfo(id=m.id, type=m.type, queue=m.queue, state="aggregating",
                    headers=m.headers, duplicate=not status.created, partition=m.partition)

# -- where each task goes ----------------------------------------------------------------
# A queue's partition count is the App's (`app.queue`) when the producer has the App, else
# what the queue's workers wrote to Redis; that is read again after LOOKUP_TTL, so a change
# of the count reaches producers without the App within seconds. Until it does they write
# to the previous partitions, which workers go on draining: nothing waits for good.

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
        """Those of `queues` whose count must be read from Redis first (a loop: most
        enqueues find none, and a comprehension is a call of its own before 3.12)."""
        stale = self.stale()
        found: set[str] = set()
        for q in set(queues):  # each queue once: a batch's tasks mostly share one
            if self.partitions(q, stale) is None:
                found.add(q)
        return sorted(found) if found else []

    def stale(self) -> float:
        """When a count read before is read again."""
        return self._now() - LOOKUP_TTL

    def partitions(self, queue: str, stale: float) -> tuple[str, ...] | None:
        """Where a task given `queue` goes by the counts known: the queue itself or its
        partitions, or () for a partition's own name (kept: an operator may address one
        partition); None when its count is to be read first (neither declared nor read
        after `stale`)."""
        if SEPARATOR in queue:
            return ()
        count = self._declared.get(queue)
        if not count:
            count, read_at = self._learned.get(queue, NEVER_READ)
            if read_at <= stale:
                return None
        return partition_names(queue, count)

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
                names = self.partitions(m.queue, NEVER_READ[1])
                if names is None:  # its count could not be read: one partition
                    names = (m.queue,)
                partitions_of[m.queue] = names
            if len(names) != 1:  # a queue of one partition: nothing to set (most tasks)
                self.place(m, names, group)

    @staticmethod
    def place(m: TaskMessage, names: tuple[str, ...], group: str = "") -> None:
        """Set the message's partition among `names` (as `partitions` gave them)."""
        if len(names) > 1:
            m.partition = choose(names, placement_key(
                m.id, m.ordering_key, m.unique_key, group and f"{m.type} {group}",
                m.debounce_key and f"{m.type} {m.debounce_key}"))
        elif not names:
            m.partition, m.queue = m.queue, queue_of(m.queue)


# -- producer hooks composed around a write ----------------------------------------------
# The App's (outermost), then a Client's, the first added outermost. A hook marked
# `sync_safe` awaits nothing but `call_next`, so a SyncClient can run the chain in its
# caller's thread with no event loop.


# a producer hook, or the function of a method that is one once bound (its self first)
AnyHook = TypeVar("AnyHook", bound=Callable[..., Awaitable[list[TaskInfo]]])


def sync_safe(hook: AnyHook) -> AnyHook:
    """Mark a producer hook that awaits nothing but `call_next`: a SyncClient can then run
    it in the caller's own thread, without an event loop. (A SyncClient with a hook not so
    marked hands its enqueues to its event-loop thread, as a hook may await anything.)
    It marks a method too, in its class: each bound one is marked."""
    hook.obsq_sync_safe = True  # type: ignore[attr-defined]
    return hook


def is_sync_safe(hook: ProducerHook) -> bool:
    return getattr(hook, "obsq_sync_safe", False) is True


class ProducerChain:
    """Producer hooks (an App's, then a Client's: the first is the outermost) around an
    innermost write, composed again only when hooks were added. A hook with an
    `obsq_for_client(client)` method (an App's send spans, which name each Client's Redis)
    is replaced by what it returns for `client`, the Client the chain writes for."""

    def __init__(self, innermost: CallNextProducer, client: Any = None) -> None:
        self.innermost = innermost
        self.client = client
        self._built: tuple[int, int] = (-1, -1)  # the hook counts `_call` was built of
        self._call: CallNextProducer = innermost

    def __call__(self, app_hooks: list[ProducerHook], hooks: list[ProducerHook]
                 ) -> CallNextProducer:
        if self._built != (len(app_hooks), len(hooks)):
            call = self.innermost
            for hook in reversed([*app_hooks, *hooks]):
                for_client = getattr(hook, "obsq_for_client", None)
                if for_client is not None and self.client is not None:
                    hook = for_client(self.client)
                call = _bind(hook, call)
            self._call, self._built = call, (len(app_hooks), len(hooks))
        return self._call


def _bind(hook: ProducerHook, call_next: CallNextProducer) -> CallNextProducer:
    def call(messages: list[TaskMessage]) -> Awaitable[list[TaskInfo]]:
        return hook(messages, call_next)
    return call


# -- concurrent calls share round trips ----------------------------------------------------
# A web app under load calls `enqueue` from many requests at once. While one enqueue of a
# queue is on its way to Redis, the enqueues issued meanwhile wait together and go in the
# next script call, so a burst of N concurrent calls costs a few round trips instead of N
# (and a few connections instead of N). A lone call goes at once, on its own: nothing waits
# for company. Each caller still gets its own statuses or its own error, and only after
# Redis has its tasks. Every round trip has the Client's deadline (`bound`), once for all
# the callers it carries rather than once a caller; a trip past it fails its callers and
# those waiting behind it at once (Redis is not answering: a caller waits one deadline at
# most, never one per trip ahead of it), so a Redis that stopped answering cannot hold a
# queue's lane for ever. A queue is registered in the namespace's
# set of queues before its first task is written; callers that see the same new queue at
# once share that one call too.

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
    puts a deadline on each round trip, whose error (`BrokerTimeout`) is given to the
    callers waiting behind it too."""

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
            return await self._bound(self._write_all(queue, messages))
        except BrokerTimeout as exc:
            self._fail_waiting(lane, exc)
            raise
        finally:
            if lane.waiting:
                lane.flusher = asyncio.ensure_future(self._flush(queue, lane))
            else:
                lane.busy = False

    @staticmethod
    def _fail_waiting(lane: _Lane, exc: BrokerTimeout) -> None:
        """Redis did not answer a trip in time: the callers waiting for the next one get
        the same error now, not a deadline each after it (their tasks were not sent)."""
        while lane.waiting:
            _, future = lane.waiting.popleft()
            if not future.done():
                future.set_exception(exc)

    def _write_all(self, queue: str, messages: list[TaskMessage]) -> Awaitable[list[Enqueued]]:
        """The messages in script calls of at most `batch` each (most enqueues: one call,
        with no coroutine of its own around it)."""
        if len(messages) <= self._batch:
            return self._write(queue, messages)
        return self._write_batches(queue, messages)

    async def _write_batches(self, queue: str, messages: list[TaskMessage]
                             ) -> list[Enqueued]:
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
                    await self._send(queue, lane, taken)
        finally:
            for _, future in lane.waiting:  # left when the flusher was stopped
                future.cancel()
            lane.waiting.clear()
            lane.busy, lane.flusher = False, None

    async def _send(self, queue: str, lane: _Lane,
                    taken: list[tuple[list[TaskMessage], asyncio.Future[list[Enqueued]]]]
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
            if isinstance(exc, BrokerTimeout):
                self._fail_waiting(lane, exc)
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
            call: asyncio.Future[R] = asyncio.ensure_future(self._call(fresh))
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
        found: set[str] = set()
        for q in queues:  # a loop: most enqueues find none (a comprehension is a call)
            if known.get(q, stale) <= stale:
                found.add(q)
        return found

    async def ensure(self, queues: Iterable[str]) -> set[str]:
        """Register the queues not known yet, or not lately; returns those this call
        registered itself."""
        new = self.unregistered(queues)
        return await self._calls.run(new) if new else new
