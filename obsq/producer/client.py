"""Producers: enqueue tasks, read their state and wait for their results.

Producer hooks form an onion around every write, like handler middleware:
`async def hook(messages, call_next) -> list[TaskInfo]`. Each message is checked
and has its id before the hooks see it, so a hook can put trace context in its
headers and name the message in a span. `Client` is asyncio; `SyncClient` offers
the same methods, blocking, for sync web apps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from obsq.app import App, Hooks, ProducerHook, RefusalHook
from obsq.broker import Broker
from obsq.broker.calls import Deadlines, call_timeout_of, deadline
from obsq.clock import Clock
from obsq.errors import (
    BrokerError,
    ConfigurationError,
    DuplicateTask,
    ResultTimeout,
    TaskNotFound,
    TaskRunning,
)
from obsq.flow import Chain, Chord, FlowInfo
from obsq.names import queue_of, validate_name, validate_namespace
from obsq.producer.enqueue import (
    EnqueueCoalescer,
    EnqueuePlan,
    EnqueueStep,
    Placement,
    ProducerChain,
    QueueRegistry,
    info_after_grouping,
    unless_duplicate,
)
from obsq.producer.fanout import check_event, check_grouped, event_jobs
from obsq.producer.flow_client import ClientFlows, or_flow
from obsq.producer.results import ResultWaiter, waited_too_long
from obsq.schedule import Schedule, ScheduleInfo, read_schedules
from obsq.settings import (
    DEFAULT_NAMESPACE,
    DEFAULT_REDIS_URL,
    ENQUEUE_BATCH,
    ENQUEUE_MEMORY_SHARE,
    env_flag,
)
from obsq.task import (
    AsyncHandler,
    EnqueueOptions,
    Job,
    PayloadIn,
    PlainHandler,
    ResultOut,
    TaskInfo,
    TaskMessage,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("obsq")

PRODUCER_ALLOWS_EVICTION = "Client(allow_eviction=True) or OBSQ_ALLOW_EVICTION=true"
_GIVE_THE_APP = ", or give the Client the App so that tasks go to their route's queue"


class Client:
    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, namespace: str | None = None, *,
                 app: App | None = None, broker: Broker | None = None,
                 allow_eviction: bool | None = None, durable_replicas: int | None = None,
                 memory_share: float | None = None, call_timeout: float | None = None,
                 clock: Clock | None = None) -> None:
        """`app` supplies the namespace (unless `namespace` is given), each route's default
        queue, max_retry and timeout, and its producer hooks (the outermost); a type it has
        no handler for (a grouped type: no aggregator) is refused (UnknownTaskType), unless
        it has no handler at all. Without it any type is enqueued. The first
        enqueue refuses a Redis whose maxmemory-policy may evict task data (ConfigurationError)
        unless `allow_eviction` (None: OBSQ_ALLOW_EVICTION) says to accept it.

        `durable_replicas=N`: an enqueue returns once N replicas have its tasks (WAIT), and
        raises BrokerError when they do not within DURABLE_WAIT_TIMEOUT, so a failover
        cannot lose an acknowledged task (refused on a Redis Cluster: ConfigurationError).
        `memory_share`: enqueues are refused (BrokerError, `out_of_memory`) once Redis uses
        more than this share of its maxmemory (default ENQUEUE_MEMORY_SHARE; 1: only Redis's
        own limit), keeping the rest for workers.
        `call_timeout` (None: OBSQ_CALL_TIMEOUT, else 5 s): each call (but result's wait)
        that Redis does not answer within it fails with BrokerTimeout. `clock`: what its
        scripts and `eta`s count time by (None: Redis's clock; obsq.testing's is manual).
        `broker`: one made already, which keeps its own durable_replicas and memory_share
        and reports its failed calls to its own `on_error`: the Client's redis_error_hooks
        when that is a Hooks registry (a Scheduler's broker, made with a call deadline of
        its own), so that hooks added to the Client later hear of them too."""
        namespace = namespace or (app.namespace if app is not None else DEFAULT_NAMESPACE)
        self.namespace = validate_namespace(namespace)
        self.call_timeout = call_timeout_of(call_timeout)
        self.app = app
        # told of each failed Redis call of its broker (instrument_client counts them)
        self.redis_error_hooks: Hooks[[str, BaseException]] = (
            broker.on_error if broker is not None and isinstance(broker.on_error, Hooks)
            else Hooks("Redis-error hook"))
        if broker is None:
            broker = Broker(redis_url, self.namespace, clock=clock,
                            on_error=self.redis_error_hooks,
                            durable_replicas=durable_replicas or 0,
                            memory_share=ENQUEUE_MEMORY_SHARE if memory_share is None
                            else memory_share)
        elif durable_replicas or memory_share is not None:
            raise ConfigurationError("a Client given a broker takes its durable_replicas and "
                                     "memory_share: give them to the Broker")
        self.broker = broker
        self.deadlines = Deadlines(seconds=self.call_timeout, error=self.broker.timed_out,
                                   user_calls=True)
        self.allow_eviction = env_flag("OBSQ_ALLOW_EVICTION") if allow_eviction is None \
            else allow_eviction
        self.results = ResultWaiter(self.broker, self.deadlines)
        self.hooks: list[ProducerHook] = []
        self._app_hooks: list[ProducerHook] = app.producer_hooks if app is not None else []
        self.refusal_hooks: Hooks[[Job, Exception]] = Hooks("refusal hook")
        self.placement = Placement(self.broker, app.partitions if app is not None else {},
                                   self._read_counts)
        self.step = EnqueueStep(app, self.placement, self.refusal_hooks)
        self._queues = QueueRegistry(self._register_queues)
        self._coalescer = EnqueueCoalescer(self.broker.enqueue, ENQUEUE_BATCH, lambda write: (
            self.deadlines.run("enqueue", write)))
        self._unheard: set[str] = set()  # events published with no subscriber, warned of
        self._looked: set[str] = set()  # queues looked at for a live worker serving them
        self._checks: set[asyncio.Future[None]] = set()
        self._chain = ProducerChain(self._store, self)
        self.flows = ClientFlows(self)  # enqueue, info, result, cancel, delete of a flow

    def use(self, hook: ProducerHook) -> ProducerHook:
        """Add a producer hook; the first added is the outermost (after the App's)."""
        self.hooks.append(hook)
        return hook

    def on_refusal(self, hook: RefusalHook) -> RefusalHook:
        """Call `hook(job, error)` for each job this Client refuses before its producer hooks
        run (after the App's refusal hooks): its checks failed."""
        self.refusal_hooks.append(hook)
        return hook

    @property
    def producer_hooks(self) -> tuple[list[ProducerHook], list[ProducerHook]]:
        """The App's producer hooks (the outermost), and this Client's."""
        return self._app_hooks, self.hooks

    @overload
    async def enqueue(self, task_type: AsyncHandler[PayloadIn, ResultOut], payload: PayloadIn,
                      *, group: str | None = None, **options: Unpack[EnqueueOptions]
                      ) -> TaskInfo[ResultOut]: ...
    @overload
    async def enqueue(self, task_type: PlainHandler[PayloadIn, ResultOut], payload: PayloadIn,
                      *, group: str | None = None, **options: Unpack[EnqueueOptions]
                      ) -> TaskInfo[ResultOut]: ...
    @overload
    async def enqueue(self, task_type: str, payload: Any = None, *, group: str | None = None,
                      **options: Unpack[EnqueueOptions]) -> TaskInfo[Any]: ...
    @overload
    async def enqueue(self, task_type: Chain | Chord) -> FlowInfo: ...

    async def enqueue(self, task_type: str | Callable[..., Any] | Chain | Chord,
                      payload: Any = None, *, queue: str | None = None,
                      max_retry: int | None = None, timeout: float | None = None,
                      delay: float | timedelta | None = None,
                      eta: datetime | timedelta | None = None,
                      unique_for: float | timedelta | None = None, task_id: str | None = None,
                      retention: float | timedelta | None = None,
                      headers: dict[str, str] | None = None,
                      ordering_key: str | None = None, group: str | None = None,
                      priority: int | None = None,
                      expires: float | timedelta | datetime | None = None,
                      debounce_key: str | None = None,
                      debounce: float | timedelta | None = None,
                      debounce_max: float | timedelta | None = None,
                      fairness_key: str | None = None) -> TaskInfo[Any] | FlowInfo:
        """Enqueue one task, named by its type or by its handler (`enqueue(send_email,
        Email(...))`: a TaskInfo[Sent], the payload checked against the handler's
        `obsq.Task[Email]`; one that cannot become it raises PayloadError, nothing written).
        Raises DuplicateTask when its id, or its type and payload
        within `unique_for` seconds, is taken; ValueError/TypeError for bad options,
        UnknownTaskType (a ValueError) for a type the Client's App has no handler for.
        Tasks sharing an `ordering_key` run one at a time, in the order they were enqueued,
        across all workers (each queue keeps its own order). `priority` (0 to 9,
        default 0 or the route's): higher runs first within its queue. Not started by
        `expires` (seconds or a timedelta from now, or an aware datetime; default the
        route's), the task never runs: it ends dead with TaskExpired. Enqueues of a type
        in a queue sharing a `debounce_key` run once, `debounce` seconds after the last of
        them (at most `debounce_max` after the first), with the last one's payload and
        options: one that finds its key's task waiting replaces it, and its TaskInfo names
        that task (`debounced`). Tasks of different `fairness_key`s (default none, or the
        route's) start in turn within their queue, so one key's backlog delays another
        key's task by one turn at most. A task given a
        `group` waits in it (state `aggregating`) for the aggregator of its type
        (app.aggregate), and takes no option but queue, task_id and headers. The enqueues
        of concurrent callers share round trips. A flow (obsq.chain, obsq.chord): FlowInfo."""
        if isinstance(task_type, (Chain, Chord)):  # within the deadline as any enqueue
            return await self.deadlines.run("enqueue", self.flows.enqueue(task_type))
        if group is not None:
            check_grouped(group, {"max_retry": max_retry, "timeout": timeout, "delay": delay,
                                  "eta": eta, "unique_for": unique_for,
                                  "retention": retention, "ordering_key": ordering_key,
                                  "priority": priority, "expires": expires,
                                  "debounce_key": debounce_key, "debounce": debounce,
                                  "debounce_max": debounce_max,
                                  "fairness_key": fairness_key})
            return await self._enqueue_grouped(group, Job(
                task_type, payload, queue=queue, task_id=task_id, headers=headers))
        job: Job[Any] = Job.__new__(Job)
        job._fill(task_type, payload, queue, max_retry, timeout, delay, eta, unique_for, task_id,
                  retention, headers, ordering_key, priority, expires, debounce_key, debounce,
                  debounce_max, fairness_key, None)
        # enqueue_many's work without its frame: one coroutine less on every enqueue
        return unless_duplicate((await self._write([job]))[0])

    async def enqueue_many(self, jobs: Sequence[Job]) -> list[TaskInfo]:
        """Enqueue many tasks in few round trips, every job checked before anything is written
        (one UnknownTaskType names every type the App has no handler for). A duplicate is
        no error here: its TaskInfo has `duplicate=True` and the holder's id."""
        return await self._write(jobs)

    def _write(self, jobs: Sequence[Job], check_types: bool = True
               ) -> Awaitable[list[TaskInfo]]:
        """The jobs checked and encoded now (`check_types`: refused when of a type the App
        cannot run), then through the producer hooks to `_store`."""
        messages = self.step.prepare(jobs, self.broker.clock.time(), check_types)
        if not messages:
            return _no_infos()
        return self._chain(self._app_hooks, self.hooks)(messages)

    def prepare(self, jobs: Sequence[Job], group: bool = False) -> list[TaskMessage]:
        """An enqueue's first step, whichever transport writes it (this Client's or the
        SyncClient's): the jobs checked and encoded now, a type the App cannot run refused
        (EnqueueStep.prepare)."""
        return self.step.prepare(jobs, self.broker.clock.time(), group=group)

    async def plan(self, messages: list[TaskMessage], group: str = "") -> EnqueuePlan:
        """Each message placed in its queue's partition (the counts not known read from
        Redis first), the messages grouped by queue (EnqueueStep.plan). A Redis is asked
        its memory policy before anything else: one that may evict is refused whole, and
        one out of reach is said so by its URL."""
        unknown = self.step.to_read(messages)
        if unknown:  # not awaited in the common case: an enqueue's await costs its CPU
            await self.placement.read(unknown)
        return self.step.plan(messages, {}, group)

    @property
    def waits_for_replicas(self) -> bool:
        """Enqueues wait for replicas (WAIT, on this Client's connections only)."""
        return bool(self.broker.durable_replicas)

    async def _store(self, messages: list[TaskMessage]) -> list[TaskInfo]:
        """The innermost layer, the enqueue step on the event loop: each queue's group
        written with the enqueues other callers make at the same time (EnqueueCoalescer),
        the queues at once."""
        # awaited only when a partition count is to be read: an await costs its CPU. Each
        # step that awaits Redis has the Client's deadline (the write has it in the
        # coalescer, once a round trip), under the name of the enqueue.
        plan = self.step.plan_known(messages)
        if plan is None:
            plan = await self.deadlines.run("enqueue", self.plan(messages))
        if self._queues.unregistered(plan.groups):  # the common case awaits nothing here
            await self.deadlines.run("enqueue", self.ensure_queues(plan.groups))
        if len(plan.groups) == 1:
            [(queue, group)] = plan.groups.items()
            return plan.answer([await self._coalescer.enqueue(queue, group)])
        return plan.answer(await asyncio.gather(*(self._coalescer.enqueue(queue, group)
                                                  for queue, group in plan.groups.items())))

    def queues_due(self, queues: Iterable[str]) -> bool:
        """Whether any of `queues` is to be registered (new to this Client, or registered
        long enough ago that a Redis restarted empty may have forgotten it)."""
        return bool(self._queues.unregistered(queues))

    async def ensure_queues(self, queues: Iterable[str]) -> None:
        """Register the queues this Client has not (Redis's memory policy checked first;
        concurrent callers share the call), and look, in the background, whether a live
        worker serves them: a wrong queue, or a worker in another namespace than the
        App's, shows at once."""
        unseen = {queue_of(q) for q in await self._queues.ensure(queues)} - self._looked
        if unseen:  # once a queue, not once a partition or registration
            self._looked |= unseen
            check = asyncio.ensure_future(self._warn_if_unserved(unseen))
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)

    @deadline("partition_counts")
    async def _read_counts(self, queues: set[str]) -> dict[str, int]:
        """Partition counts, Redis's memory policy checked first (a Client's first call)."""
        await self.check_memory_policy()
        return await self.broker.partition_counts(sorted(queues))

    @deadline("register")
    async def _register_queues(self, queues: set[str]) -> None:
        """Before a queue's first task: refuse an evicting Redis (unless allowed), register."""
        await self.check_memory_policy()
        await self.broker.register_queues(queues)

    @deadline("memory_policy")
    async def check_memory_policy(self) -> None:
        """Refuse a Redis that may evict tasks, unless allowed (asked once)."""
        await self.broker.check_memory_policy(refuse=not self.allow_eviction,
                                              allowed_by=PRODUCER_ALLOWS_EVICTION)

    @deadline("enqueue")
    async def _enqueue_grouped(self, group: str, job: Job) -> TaskInfo:
        """Through the producer hooks (trace context, counts) into the group."""
        async def store(messages: list[TaskMessage]) -> list[TaskInfo]:
            await self.plan(messages, group)
            m, kept_in = messages[0], messages[0].partition or messages[0].queue
            await self.ensure_queues([kept_in])
            status = (await self.broker.group(kept_in, m.type, group, messages))[0]
            return [info_after_grouping(m, status)]

        messages = self.prepare([job], group=True)
        info = (await ProducerChain(store, self)(*self.producer_hooks)(messages))[0]
        if info.duplicate:
            raise DuplicateTask(f"task id {info.id!r} is taken", info.id)
        return info

    @deadline("publish")
    async def publish(self, event: str, payload: Any = None, *, event_id: str | None = None,
                      headers: dict[str, str] | None = None) -> list[TaskInfo]:
        """Deliver one copy of the event to each subscriber registered in Redis now
        (`@app.subscribe`): a task per subscriber, with its own retries and dead-letter
        entry. Give `event_id` to publish safely again after an error: a copy delivered
        already is not delivered twice (its TaskInfo says duplicate). With no subscriber,
        nothing is delivered (logged once per event) and the list is empty."""
        check_event(event, event_id)
        subscribers = await self.broker.subscribers(event)
        if not subscribers:
            if event not in self._unheard:
                self._unheard.add(event)
                log.warning("event %r of namespace %r has no live subscriber: nothing "
                            "delivered", event, self.namespace)
            return []
        # the subscribers registered in Redis are served by their workers' Apps, not this one
        return await self._write(event_jobs(event, payload, subscribers, event_id, headers),
                                 check_types=False)

    async def _warn_if_unserved(self, queues: set[str]) -> None:
        try:
            workers = await self.broker.workers()
        except BrokerError:
            return  # the enqueue itself reports a Redis that is away
        served = {q for w in workers for q in w.get("queues") or ()}
        for queue in sorted(queues - served):
            log.warning("enqueued to queue %r of namespace %r, which no live worker serves: "
                        "start one with --namespace %s --queues %s%s", queue, self.namespace,
                        self.namespace, queue, "" if self.app else _GIVE_THE_APP)

    @deadline("task_info")
    @or_flow
    async def info(self, task_id: str, queue: str | None = None) -> TaskInfo[Any] | FlowInfo:
        """The task's (or flow's: its FlowInfo or id) current state; raises TaskNotFound."""
        queue = await self.placement.locate(task_id, queue)
        if queue is not None:
            fields, progress = await self.broker.task_fields(queue, task_id)
            if fields:
                return TaskInfo.from_fields(task_id, queue, fields, progress)
        raise TaskNotFound(f"no task {task_id!r} (tasks without retention are removed "
                           "when they complete)")

    @overload
    async def result(self, task_id: TaskInfo[ResultOut], timeout: float | None = None,
                     queue: str | None = None) -> ResultOut: ...
    @overload
    async def result(self, task_id: str | FlowInfo, timeout: float | None = None,
                     queue: str | None = None) -> Any: ...

    async def result(self, task_id: str | TaskInfo[Any] | FlowInfo,
                     timeout: float | None = None, queue: str | None = None) -> Any:
        """Wait until the task completes and return its result: a TaskInfo[R]'s as an R
        (its handler's result type read back, PayloadError when the stored result is not
        one). Raises TaskFailed if it ends
        dead, ResultTimeout (a TimeoutError) after `timeout` seconds, TaskNotFound if it
        is gone. A flow's (its FlowInfo, or id) is its last step's (FlowFailed: a step ended it)."""
        if isinstance(task_id, FlowInfo):
            return await self.flows.result(task_id.id, timeout)
        if isinstance(task_id, TaskInfo):
            value = await self.result(task_id.id, timeout, task_id.partition or task_id.queue)
            declared = task_id.result_type
            return value if declared is None else declared.decode(
                value, f"the result of task {task_id.id}")
        try:  # a Redis that stops answering cannot stretch the wait past `timeout` either
            return await asyncio.wait_for(self._result(task_id, timeout, queue), timeout)
        except ResultTimeout:
            raise
        except asyncio.TimeoutError:
            raise waited_too_long(task_id, timeout or 0) from None
        except TaskNotFound:
            if not await self.deadlines.run("flow_state", self.flows.named(task_id, queue)):
                raise
        return await self.flows.result(task_id, timeout)  # a flow's id: no task has it

    async def _result(self, task_id: str, timeout: float | None, queue: str | None) -> Any:
        queue = await self.deadlines.run("find_queue", self.placement.locate(task_id, queue))
        if queue is None:
            raise TaskNotFound(f"no task {task_id!r}")
        return await self.results.wait(queue, task_id, timeout)

    @deadline("cancel")
    @or_flow
    async def cancel(self, task_id: str, queue: str | None = None) -> str:
        """Cancel a task. One waiting (pending, scheduled, retrying, held) never runs and
        ends in state `cancelled`: returns "cancelled". One running is stopped by its worker
        within moments (async handlers get asyncio.CancelledError, plain functions see
        `task.cancelled`) and then ends cancelled: returns "running". One that ended already
        stays as it is: returns its state. Raises TaskNotFound. A flow (or its id): ClientFlows."""
        queue = await self.placement.locate(task_id, queue)
        state = await self.broker.cancel(queue, task_id) if queue else ""
        if not state:
            raise TaskNotFound(f"no task {task_id!r}")
        return state

    @deadline("delete")
    @or_flow
    async def delete(self, task_id: str, queue: str | None = None) -> str:
        """Delete a task (or an ended flow and its steps) that is not running, with all kept
        for it; returns the state it was in. Raises TaskRunning (cancel first), TaskNotFound."""
        queue = await self.placement.locate(task_id, queue)
        state = await self.broker.delete_task(queue, task_id) if queue else ""
        if state == "running":
            raise TaskRunning(f"task {task_id} is running: cancel it first")
        if not state:
            raise TaskNotFound(f"no task {task_id!r}")
        return state

    @deadline("schedule")
    async def schedule(self, /, name: str, spec: str, task_type: str, payload: Any = None, *,
                       timezone: str = "UTC", missed: str = "once",
                       **options: Any) -> Schedule:
        """Add or replace a schedule entry at run time: `obsq scheduler` enqueues
        `task_type` with `payload` on the cron spec (read in `timezone`) or at the interval
        ('@every 30s'), from the moment it reads this (at once). `missed`: of the fires the
        schedulers were all down for, "once" enqueues the latest, "skip" none. Options are
        those of enqueue but task_id, delay and eta. Everything is checked before anything
        is written (ValueError, TypeError); an identical entry keeps its state."""
        entry = Schedule(name, spec, task_type, payload, timezone, missed, options)
        if await self.broker.put_schedule(name, entry.encoded()) == "app":
            raise ValueError(f"schedule {name!r} is defined by the App's code "
                             "(app.periodic): change it there")
        return entry

    @deadline("unschedule")
    async def unschedule(self, name: str) -> bool:
        """Remove an entry added at run time; False when there is none of that name."""
        if (status := await self.broker.remove_schedule(validate_name("schedule", name))
                ) == "app":
            raise ValueError(f"schedule {name!r} is defined by the App's code "
                             "(app.periodic): remove it there")
        return status == "removed"

    @deadline("schedules")
    async def schedules(self) -> list[ScheduleInfo]:
        """Every entry, the App's and those added at run time, with its next and last fire,
        the soonest first."""
        return await read_schedules(self.broker)

    async def close(self) -> None:
        for check in list(self._checks):
            check.cancel()
        await self._coalescer.close()
        await self.results.close()
        await self.broker.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["Client", "ProducerHook"]


async def _no_infos() -> list[TaskInfo]:
    return []
