"""Recording how each attempt ended, then telling the outcome hooks.

Completions are batched without waiting on a timer: they gather here until the worker's
fetch loop next talks to Redis, which sends them in the same round trip as its next fetch
(`take_acks`/`resolve_acks`); a busy worker thus pays one round trip for many tasks and an
idle one no delay. A Redis that is away is retried with backoff; an attempt whose fencing
token went stale (its lease was taken over) ends as `lease_lost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from obsq.app import OutcomeHook
from obsq.broker import AckBatches, Broker
from obsq.errors import BrokerError
from obsq.execution import Verdict
from obsq.settings import redis_retry_delay
from obsq.task import Task

log = logging.getLogger("obsq")
AckItem = tuple[str, int, float, bytes, str]
PendingAcks = dict[str, list[tuple[AckItem, "asyncio.Future[bool]"]]]


class Settler:
    def __init__(self, broker: Broker, worker_id: str, hooks: list[OutcomeHook]) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.hooks = hooks
        self._acks: PendingAcks = {}
        self.acks_waiting = asyncio.Event()
        self._gave_up = False
        self.direct = False  # draining: send each completion at once, no fetch carries it

    async def settle(self, task: Task, verdict: Verdict) -> str:
        """Record the verdict in Redis; returns the final outcome."""
        if verdict.outcome == "success":
            future = asyncio.get_running_loop().create_future()
            self._acks.setdefault(task.queue, []).append(
                ((task.id, task.fence, task.retention, verdict.result, task.unique_key),
                 future))
            self.acks_waiting.set()
            if self.direct:
                await self._persist(self.flush)
            accepted = await future
        elif verdict.outcome == "retry":
            accepted = await self._persist(lambda: self.broker.retry(
                task.queue, task.id, task.fence, self.worker_id, verdict.delay,
                verdict.error_text, verdict.traceback_text))
        else:
            accepted = await self._persist(lambda: self.broker.kill(
                task.queue, task.id, task.fence, self.worker_id, verdict.error_text,
                verdict.traceback_text))
        outcome = verdict.outcome if accepted else "lease_lost"
        if not accepted:
            log.warning("task %s (%s) finished after its lease was taken over; its %s was "
                        "refused", task.id, task.type, verdict.outcome)
        elif verdict.outcome != "success":
            then = (f"will retry in {verdict.delay:.1f} s" if verdict.outcome == "retry"
                    else "moved to dead")
            log.warning("task %s (%s) failed, %s: %s", task.id, task.type, then,
                        verdict.error_text)
        self.report(task, outcome, verdict.error)
        return outcome

    async def requeue(self, tasks: list[Task]) -> None:
        """Hand unfinished attempts back to pending at once (graceful shutdown)."""
        by_queue: dict[str, list[Task]] = {}
        for task in tasks:
            by_queue.setdefault(task.queue, []).append(task)
        for queue, group in by_queue.items():
            accepted = await self._persist(lambda q=queue, g=group: self.broker.requeue(
                q, [(t.id, t.fence) for t in g], self.worker_id), attempts=5)
            for task, ok in zip(group, accepted or [False] * len(group)):
                self.report(task, "requeued" if ok else "lease_lost", None)

    def report(self, task: Task, outcome: str, error: BaseException | None) -> None:
        for hook in self.hooks:
            try:
                hook(task, outcome, error)
            except Exception:
                log.exception("outcome hook %r failed", hook)

    def take_acks(self) -> tuple[AckBatches, PendingAcks]:
        """Hand the gathered completions to the caller, who sends them to Redis and then
        calls resolve_acks (or restore_acks if the call failed)."""
        pending, self._acks = self._acks, {}
        self.acks_waiting.clear()
        return {q: [item for item, _ in entries] for q, entries in pending.items()}, pending

    def resolve_acks(self, pending: PendingAcks, results: dict[str, list[bool]]) -> None:
        for queue, entries in pending.items():
            for (_, future), accepted in zip(entries, results[queue]):
                if not future.done():
                    future.set_result(accepted)

    def restore_acks(self, pending: PendingAcks) -> None:
        for queue, entries in pending.items():
            self._acks[queue] = entries + self._acks.get(queue, [])
        if self._acks:
            self.acks_waiting.set()

    async def flush(self) -> None:
        """Send the gathered completions on their own (when no fetch is due)."""
        batches, pending = self.take_acks()
        if not batches:
            return
        try:
            results = await self.broker.ack(batches, self.worker_id)
        except BrokerError:
            self.restore_acks(pending)
            raise
        self.resolve_acks(pending, results)

    async def close(self, timeout: float) -> None:
        """Flush what is left, retrying while Redis is away for up to `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        failures = 0
        while self._acks:
            try:
                await self.flush()
            except BrokerError as exc:
                failures += 1
                if loop.time() >= deadline:
                    log.error("gave up recording %d completion(s): %s; their leases will "
                              "expire and they will run again",
                              sum(map(len, self._acks.values())), exc)
                    break
                await asyncio.sleep(redis_retry_delay(failures))
        self._gave_up = True
        for entries in self._acks.values():
            for _, future in entries:
                if not future.done():
                    future.set_result(False)
        self._acks = {}

    async def _persist(self, call: Callable[[], Awaitable[Any]],
                       attempts: int | None = None) -> Any:
        """Retry a settling call while Redis is away (until the worker gives up)."""
        failures = 0
        while True:
            try:
                return await call()
            except BrokerError as exc:
                failures += 1
                if self._gave_up or (attempts is not None and failures >= attempts):
                    log.error("gave up recording an outcome: %s; the task's lease will "
                              "expire and it will run again", exc)
                    return None
                if failures == 1:
                    log.warning("cannot record an outcome: %s; retrying", exc)
                await asyncio.sleep(redis_retry_delay(failures))
