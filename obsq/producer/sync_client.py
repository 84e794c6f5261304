"""SyncClient: the Client's methods, blocking, for sync web apps.

Enqueues run in the caller's own thread on a blocking Redis client (obsq.broker.blocking),
through the same producer hooks, when every hook is `sync_safe`: a request pays one round
trip, with no hand-over to another thread. Everything else (results, waits, schedules,
and enqueues through hooks that may await anything) runs a Client on a private event-loop
thread, carrying the caller's context (e.g. the current trace span) into each call.
Both paths end within the Client's call_timeout (BrokerTimeout), as the Client's calls do.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from obsq.app import ProducerHook
from obsq.broker.blocking import BlockingProducer
from obsq.errors import BrokerError
from obsq.flow import Chain, Chord, FlowInfo
from obsq.producer.client import Client
from obsq.producer.enqueue import ProducerChain, is_sync_safe, unless_duplicate
from obsq.schedule import Schedule, ScheduleInfo
from obsq.settings import DEFAULT_REDIS_URL
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

T = TypeVar("T")


class SyncClient:
    """The Client's methods, blocking. Enqueues run in the caller's thread on a blocking
    Redis client when every producer hook is `sync_safe` (obsq's own are); the other
    methods, and enqueues through hooks that may await anything, run a Client on a private
    event-loop thread, carrying the caller's context (e.g. the current trace span) in."""

    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, namespace: str | None = None,
                 **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="obsq-sync-client",
                                        daemon=True)
        self._thread.start()
        self._client: Client = self._run(_make_client(redis_url, namespace, options))
        self._producer = BlockingProducer(self._client.broker, self._client.call_timeout)
        self._chain = ProducerChain(self._store, self._client)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        context = contextvars.copy_context()
        future = asyncio.run_coroutine_threadsafe(_in_context(coro, context), self._loop)
        return future.result()

    def use(self, hook: ProducerHook) -> ProducerHook:
        return self._client.use(hook)

    @overload
    def enqueue(self, task_type: AsyncHandler[PayloadIn, ResultOut], payload: PayloadIn, *,
                group: str | None = None, **options: Unpack[EnqueueOptions]
                ) -> TaskInfo[ResultOut]: ...
    @overload
    def enqueue(self, task_type: PlainHandler[PayloadIn, ResultOut], payload: PayloadIn, *,
                group: str | None = None, **options: Unpack[EnqueueOptions]
                ) -> TaskInfo[ResultOut]: ...
    @overload
    def enqueue(self, task_type: str, payload: Any = None, *, group: str | None = None,
                **options: Unpack[EnqueueOptions]) -> TaskInfo[Any]: ...
    @overload
    def enqueue(self, task_type: Chain | Chord) -> FlowInfo: ...

    def enqueue(self, task_type: str | Callable[..., Any] | Chain | Chord,
                payload: Any = None, *, queue: str | None = None,
                max_retry: int | None = None, timeout: float | None = None,
                delay: float | timedelta | None = None,
                eta: datetime | timedelta | None = None,
                unique_for: float | timedelta | None = None, task_id: str | None = None,
                retention: float | timedelta | None = None,
                headers: dict[str, str] | None = None, ordering_key: str | None = None,
                group: str | None = None, priority: int | None = None,
                expires: float | timedelta | datetime | None = None,
                debounce_key: str | None = None, debounce: float | timedelta | None = None,
                debounce_max: float | timedelta | None = None,
                fairness_key: str | None = None) -> TaskInfo[Any] | FlowInfo:
        """Client.enqueue, blocking."""
        if isinstance(task_type, (Chain, Chord)):
            return self._run(self._client.enqueue(task_type))
        if group is not None:
            return self._run(self._client.enqueue(
                task_type, payload, queue=queue, max_retry=max_retry, timeout=timeout,
                delay=delay, eta=eta, unique_for=unique_for, task_id=task_id,
                retention=retention, headers=headers, ordering_key=ordering_key, group=group,
                priority=priority, expires=expires, debounce_key=debounce_key,
                debounce=debounce, debounce_max=debounce_max, fairness_key=fairness_key))
        job: Job[Any] = Job.__new__(Job)  # by position, as Client.enqueue makes it
        job._fill(task_type, payload, queue, max_retry, timeout, delay, eta, unique_for, task_id,
                  retention, headers, ordering_key, priority, expires, debounce_key, debounce,
                  debounce_max, fairness_key, None)
        return unless_duplicate(self.enqueue_many([job])[0])

    def enqueue_many(self, jobs: Sequence[Job]) -> list[TaskInfo]:
        app_hooks, hooks = self._client.producer_hooks
        if self._client.waits_for_replicas or not all(map(is_sync_safe, (*app_hooks, *hooks))):
            return self._run(self._client.enqueue_many(jobs))
        messages = self._client.prepare(jobs)
        try:
            return _run_now(self._chain(app_hooks, hooks)(messages)) if messages else []
        except BrokerError as exc:  # named by the user's call, as the Client's are
            raise exc.during("enqueue") from exc.__cause__

    async def _store(self, messages: list[TaskMessage]) -> list[TaskInfo]:
        """The innermost layer of the enqueues made in the caller's thread, the Client's
        enqueue step on a blocking transport: it blocks, and awaits nothing, so the hooks
        around it run to their end at once. A queue new to it, or not registered lately
        (a Redis restarted empty forgot it), is registered by the Client (once for both, on
        its event-loop thread)."""
        step = self._client.step
        plan = step.plan_known(messages)
        if plan is None:
            unknown = step.to_read(messages)
            plan = step.plan(messages,
                             self._producer.partition_counts(unknown) if unknown else {})
        if self._client.queues_due(plan.groups):
            self._run(self._client.ensure_queues(plan.groups))
        return plan.answer([self._producer.enqueue(queue, group)
                            for queue, group in plan.groups.items()])

    def publish(self, event: str, payload: Any = None, *, event_id: str | None = None,
                headers: dict[str, str] | None = None) -> list[TaskInfo[Any]]:
        """Client.publish, blocking."""
        return self._run(self._client.publish(event, payload, event_id=event_id,
                                              headers=headers))

    def info(self, task_id: str | FlowInfo, queue: str | None = None
             ) -> TaskInfo[Any] | FlowInfo:
        return self._run(self._client.info(task_id, queue))

    @overload
    def result(self, task_id: TaskInfo[ResultOut], timeout: float | None = None,
               queue: str | None = None) -> ResultOut: ...
    @overload
    def result(self, task_id: str | FlowInfo, timeout: float | None = None,
               queue: str | None = None) -> Any: ...

    def result(self, task_id: str | TaskInfo[Any] | FlowInfo, timeout: float | None = None,
               queue: str | None = None) -> Any:
        """Client.result, blocking."""
        return self._run(self._client.result(task_id, timeout, queue))

    def cancel(self, task_id: str | FlowInfo, queue: str | None = None) -> str:
        return self._run(self._client.cancel(task_id, queue))

    def delete(self, task_id: str | FlowInfo, queue: str | None = None) -> str:
        return self._run(self._client.delete(task_id, queue))

    def schedule(self, name: str, spec: str, task_type: str, payload: Any = None,
                 **options: Any) -> Schedule:
        return self._run(self._client.schedule(name, spec, task_type, payload, **options))

    def unschedule(self, name: str) -> bool:
        return self._run(self._client.unschedule(name))

    def schedules(self) -> list[ScheduleInfo]:
        return self._run(self._client.schedules())

    def close(self) -> None:
        self._producer.close()
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


def _run_now(work: Awaitable[T]) -> T:
    """Run to its end, in this thread, a coroutine that never suspends (sync_safe hooks
    around a blocking write)."""
    steps = work.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        value: T = done.value
        return value
    steps.close()
    raise RuntimeError("a producer hook marked sync_safe awaited something other than "
                       "call_next")


async def _in_context(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    """Run `coro` as a task created inside the caller's context."""
    task: asyncio.Future[T] = context.run(asyncio.ensure_future, coro)
    return await task


__all__ = ["SyncClient"]
