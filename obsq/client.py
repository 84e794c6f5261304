"""Producers: enqueue tasks, read their state and wait for their results.

Producer hooks form an onion around every write, like handler middleware:
`async def hook(messages, call_next) -> list[TaskInfo]`. Each message is checked
and has its id before the hooks see it, so a hook can put trace context in its
headers and name the message in a span. `Client` is asyncio; `SyncClient` offers
the same methods, blocking, for sync web apps.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

from obsq.app import App, CallNextProducer, ProducerHook
from obsq.broker import Broker, Enqueued
from obsq.errors import BrokerError, DuplicateTask, TaskNotFound, TaskRunning
from obsq.fanout import check_event, check_grouped, event_jobs
from obsq.results import ResultWaiter
from obsq.schedule import Schedule, ScheduleInfo
from obsq.settings import (
    DEFAULT_NAMESPACE,
    DEFAULT_REDIS_URL,
    ENQUEUE_BATCH,
    SCHEDULES_SHOWN,
    env_flag,
)
from obsq.task import (
    Job,
    TaskInfo,
    TaskMessage,
    build_message,
    validate_name,
)

log = logging.getLogger("obsq")

T = TypeVar("T")


class Client:
    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, namespace: str | None = None, *,
                 app: App | None = None, broker: Broker | None = None,
                 allow_eviction: bool | None = None) -> None:
        """`app` supplies the namespace (unless `namespace` is given), each route's default
        queue, max_retry and timeout, and its producer hooks (the outermost). The first
        enqueue refuses a Redis whose maxmemory-policy may evict task data (ConfigurationError)
        unless `allow_eviction` (None: OBSQ_ALLOW_EVICTION) says to accept it."""
        namespace = namespace or (app.namespace if app is not None else DEFAULT_NAMESPACE)
        self.namespace = validate_name("namespace", namespace)
        self.app = app
        self.broker = broker or Broker(redis_url, self.namespace)
        self.allow_eviction = env_flag("OBSQ_ALLOW_EVICTION") if allow_eviction is None \
            else allow_eviction
        self.results = ResultWaiter(self.broker)
        self.hooks: list[ProducerHook] = []
        self._known_queues: set[str] = set()
        self._unheard: set[str] = set()  # events published with no subscriber, warned of
        self._checks: set[asyncio.Future[None]] = set()
        self._composed: tuple[int, int] = (-1, -1)  # the hook counts _write was built of
        self._write: CallNextProducer = self._store

    def use(self, hook: ProducerHook) -> ProducerHook:
        """Add a producer hook; the first added is the outermost (after the App's)."""
        self.hooks.append(hook)
        return hook

    def _writer(self) -> CallNextProducer:
        """The producer hooks around the write, built again when hooks were added."""
        app_hooks = self.app.producer_hooks if self.app is not None else []
        if self._composed != (len(app_hooks), len(self.hooks)):
            self._write = _chain([*app_hooks, *self.hooks], self._store)
            self._composed = (len(app_hooks), len(self.hooks))
        return self._write

    async def enqueue(self, task_type: str, payload: Any = None, *, queue: str | None = None,
                      max_retry: int | None = None, timeout: float | None = None,
                      delay: float | None = None, eta: datetime | None = None,
                      unique_for: float | None = None, task_id: str | None = None,
                      retention: float | None = None, headers: dict[str, str] | None = None,
                      ordering_key: str | None = None, group: str | None = None) -> TaskInfo:
        """Enqueue one task. Raises DuplicateTask when its id, or its type and payload
        within `unique_for` seconds, is taken; ValueError/TypeError for bad options.
        Tasks sharing an `ordering_key` run one at a time, in the order they were
        enqueued, across all workers (each queue keeps its own order). A task given a
        `group` waits in it (state `aggregating`) for the aggregator of its type
        (app.aggregate), and takes no option but queue, task_id and headers."""
        if group is not None:
            check_grouped(group, {"max_retry": max_retry, "timeout": timeout, "delay": delay,
                                  "eta": eta, "unique_for": unique_for,
                                  "retention": retention, "ordering_key": ordering_key})
            return await self._enqueue_grouped(group, Job(
                task_type, payload, queue=queue, task_id=task_id, headers=dict(headers or {})))
        job = Job(task_type, payload, queue=queue, max_retry=max_retry, timeout=timeout,
                  delay=delay, eta=eta, unique_for=unique_for, task_id=task_id,
                  retention=retention, headers=dict(headers or {}), ordering_key=ordering_key)
        info = (await self.enqueue_many([job]))[0]
        if info.duplicate:
            raise DuplicateTask(f"task {task_type!r} is a duplicate of {info.id}", info.id)
        return info

    async def enqueue_many(self, jobs: Sequence[Job]) -> list[TaskInfo]:
        """Enqueue many tasks in few round trips. Every job is checked before anything is
        written. A duplicate is not an error here: its TaskInfo has `duplicate=True` and the
        id of the task that holds the id or the unique lock."""
        now = time.time()
        messages = [self._message(job, now) for job in jobs]
        return await self._writer()(messages) if messages else []

    def _message(self, job: Job, now: float) -> TaskMessage:
        if self.app is None:
            return build_message(job, now=now)
        route = self.app.route(job.type)
        if route is None:
            return build_message(job, now=now, max_payload=self.app.max_payload)
        return build_message(job, queue=route.queue, max_retry=route.max_retry,
                             timeout=route.timeout, now=now,
                             max_payload=self.app.max_payload_of(route))

    async def _store(self, messages: list[TaskMessage]) -> list[TaskInfo]:
        """The innermost layer: group by queue, write in bounded batches, one round trip."""
        by_queue: dict[str, list[TaskMessage]] = {}
        for m in messages:
            by_queue.setdefault(m.queue, []).append(m)
        new_queues = by_queue.keys() - self._known_queues
        if new_queues:
            await self.broker.check_memory_policy(refuse=not self.allow_eviction)
            await self.broker.register_queues(new_queues)
            self._known_queues |= new_queues
            if self.app is None:  # nothing says where its tasks belong: look, once a queue
                check = asyncio.ensure_future(self._warn_if_unserved(new_queues))
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)
        statuses: dict[int, Enqueued] = {}  # by message object: two jobs may share a task_id
        for queue, group in by_queue.items():
            for start in range(0, len(group), ENQUEUE_BATCH):
                chunk = group[start:start + ENQUEUE_BATCH]
                for m, status in zip(chunk, await self.broker.enqueue(queue, chunk)):
                    statuses[id(m)] = status
        return [_info_after_enqueue(m, statuses[id(m)]) for m in messages]

    async def _enqueue_grouped(self, group: str, job: Job) -> TaskInfo:
        """Through the producer hooks (trace context, counts) into the group."""
        async def store(messages: list[TaskMessage]) -> list[TaskInfo]:
            m = messages[0]
            if m.queue not in self._known_queues:  # as _store does
                await self.broker.check_memory_policy(refuse=not self.allow_eviction)
                await self.broker.register_queues([m.queue])
                self._known_queues.add(m.queue)
            status = (await self.broker.group(m.queue, m.type, group, messages))[0]
            return [TaskInfo(id=m.id, type=m.type, queue=m.queue, state="aggregating",
                             headers=m.headers, duplicate=not status.created)]

        app_hooks = self.app.producer_hooks if self.app is not None else []
        write = _chain([*app_hooks, *self.hooks], store)
        info = (await write([self._message(job, time.time())]))[0]
        if info.duplicate:
            raise DuplicateTask(f"task id {info.id!r} is taken", info.id)
        return info

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
        return await self.enqueue_many(event_jobs(event, payload, subscribers, event_id,
                                                  headers))

    async def _warn_if_unserved(self, queues: set[str]) -> None:
        try:
            workers = await self.broker.workers()
        except BrokerError:
            return  # the enqueue itself reports a Redis that is away
        served = {q for w in workers for q in w.get("queues") or ()}
        for queue in sorted(queues - served):
            log.warning("enqueued to queue %r of namespace %r, which no live worker serves: "
                        "start one with --queues %s, or give the Client the App so that "
                        "tasks go to their route's queue", queue, self.namespace, queue)

    async def info(self, task_id: str, queue: str | None = None) -> TaskInfo:
        """The task's current state; raises TaskNotFound."""
        queue = queue or await self.broker.find_queue(task_id)
        if queue is not None:
            fields, progress = await self.broker.task_fields(queue, task_id)
            if fields:
                return TaskInfo.from_fields(task_id, queue, fields, progress)
        raise TaskNotFound(f"no task {task_id!r} (tasks without retention are removed "
                           "when they complete)")

    async def result(self, task_id: str | TaskInfo, timeout: float | None = None,
                     queue: str | None = None) -> Any:
        """Wait until the task completes and return its result. Raises TaskFailed if it ends
        dead, TimeoutError after `timeout` seconds, TaskNotFound if it is gone."""
        if isinstance(task_id, TaskInfo):
            queue, task_id = task_id.queue, task_id.id
        queue = queue or await self.broker.find_queue(task_id)
        if queue is None:
            raise TaskNotFound(f"no task {task_id!r}")
        return await self.results.wait(queue, task_id, timeout)

    async def cancel(self, task_id: str, queue: str | None = None) -> str:
        """Cancel a task. One waiting (pending, scheduled, retrying, held) never runs and
        ends in state `cancelled`: returns "cancelled". One running is stopped by its worker
        within moments (async handlers get asyncio.CancelledError, plain functions see
        `task.cancelled`) and then ends cancelled: returns "running". One that ended already
        stays as it is: returns its state. Raises TaskNotFound."""
        queue = queue or await self.broker.find_queue(task_id)
        state = await self.broker.cancel(queue, task_id) if queue else ""
        if not state:
            raise TaskNotFound(f"no task {task_id!r}")
        return state

    async def delete(self, task_id: str, queue: str | None = None) -> str:
        """Delete a task that is not running, with all that is kept for it; returns the
        state it was in. Raises TaskRunning (cancel it first) or TaskNotFound."""
        queue = queue or await self.broker.find_queue(task_id)
        state = await self.broker.delete_task(queue, task_id) if queue else ""
        if state == "running":
            raise TaskRunning(f"task {task_id} is running: cancel it first")
        if not state:
            raise TaskNotFound(f"no task {task_id!r}")
        return state

    async def schedule(self, name: str, spec: str, task_type: str, payload: Any = None, *,
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

    async def unschedule(self, name: str) -> bool:
        """Remove an entry added at run time; False when there is none of that name."""
        validate_name("schedule", name)
        status = await self.broker.remove_schedule(name)
        if status == "app":
            raise ValueError(f"schedule {name!r} is defined by the App's code "
                             "(app.periodic): remove it there")
        return status == "removed"

    async def schedules(self) -> list[ScheduleInfo]:
        """Every entry, the App's and those added at run time, with its next and last fire,
        the soonest first."""
        return await read_schedules(self.broker)

    async def close(self) -> None:
        for check in list(self._checks):
            check.cancel()
        await self.results.close()
        await self.broker.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def read_schedules(broker: Broker, limit: int = SCHEDULES_SHOWN) -> list[ScheduleInfo]:
    """Up to `limit` schedule entries, soonest next fire first (the Client's and the
    Inspector's listing)."""
    now_ms, records = await broker.schedule_table(limit)
    return [ScheduleInfo.from_stored(*record, now_ms=now_ms) for record in records]


def _chain(hooks: list[ProducerHook], innermost: CallNextProducer) -> CallNextProducer:
    """The hooks around `innermost`, the first outermost."""
    call = innermost
    for hook in reversed(hooks):
        call = _bind(hook, call)
    return call


def _bind(hook: ProducerHook, call_next: CallNextProducer) -> CallNextProducer:
    def call(messages: list[TaskMessage]) -> Awaitable[list[TaskInfo]]:
        return hook(messages, call_next)
    return call


def _info_after_enqueue(m: TaskMessage, status: Enqueued) -> TaskInfo:
    return TaskInfo(id=status.existing_id or m.id, type=m.type, queue=m.queue,
                    state="scheduled" if m.delay > 0 else "pending", max_retry=m.max_retry,
                    headers=m.headers, duplicate=not status.created)


class SyncClient:
    """The Client's methods, blocking. It runs a Client on a private event-loop thread and
    carries the caller's context (e.g. the current trace span) into each call."""

    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, namespace: str | None = None,
                 **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="obsq-sync-client",
                                        daemon=True)
        self._thread.start()
        self._client: Client = self._run(_make_client(redis_url, namespace, options))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        context = contextvars.copy_context()
        future: Any = asyncio.run_coroutine_threadsafe(_in_context(coro, context), self._loop)
        return future.result()

    def use(self, hook: ProducerHook) -> ProducerHook:
        return self._client.use(hook)

    def enqueue(self, task_type: str, payload: Any = None, **options: Any) -> TaskInfo:
        return self._run(self._client.enqueue(task_type, payload, **options))

    def enqueue_many(self, jobs: Sequence[Job]) -> list[TaskInfo]:
        return self._run(self._client.enqueue_many(jobs))

    def publish(self, event: str, payload: Any = None, **options: Any) -> list[TaskInfo]:
        return self._run(self._client.publish(event, payload, **options))

    def info(self, task_id: str, queue: str | None = None) -> TaskInfo:
        return self._run(self._client.info(task_id, queue))

    def result(self, task_id: str | TaskInfo, timeout: float | None = None,
               queue: str | None = None) -> Any:
        return self._run(self._client.result(task_id, timeout, queue))

    def cancel(self, task_id: str, queue: str | None = None) -> str:
        return self._run(self._client.cancel(task_id, queue))

    def delete(self, task_id: str, queue: str | None = None) -> str:
        return self._run(self._client.delete(task_id, queue))

    def schedule(self, name: str, spec: str, task_type: str, payload: Any = None,
                 **options: Any) -> Schedule:
        return self._run(self._client.schedule(name, spec, task_type, payload, **options))

    def unschedule(self, name: str) -> bool:
        return self._run(self._client.unschedule(name))

    def schedules(self) -> list[ScheduleInfo]:
        return self._run(self._client.schedules())

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make_client(redis_url: str, namespace: str | None, options: dict[str, Any]
                       ) -> Client:
    return Client(redis_url, namespace, **options)


async def _in_context(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    """Run `coro` as a task created inside the caller's context."""
    task = context.run(asyncio.ensure_future, coro)
    return await task


__all__ = ["Client", "ProducerHook", "SyncClient"]
