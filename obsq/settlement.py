"""Recording how each attempt ended, then telling the outcome hooks.

Completions are batched without waiting on a timer: while one batch is on its way to
Redis the next one gathers, so a busy worker pays one round trip for many tasks and an
idle one pays no delay. A Redis that is away is retried with backoff; an attempt whose
fencing token went stale (its lease was taken over) ends as `lease_lost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from obsq.app import OutcomeHook
from obsq.broker import Broker
from obsq.errors import BrokerError
from obsq.execution import Verdict
from obsq.settings import REDIS_RETRY_MAX, REDIS_RETRY_MIN
from obsq.task import Task

log = logging.getLogger("obsq")
AckItem = tuple[str, int, float, bytes]


class Settler:
    def __init__(self, broker: Broker, hooks: list[OutcomeHook]) -> None:
        self.broker = broker
        self.hooks = hooks
        self._acks: dict[str, list[tuple[AckItem, asyncio.Future[bool]]]] = {}
        self._more = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._gave_up = False

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever(), name="obsq-acks")

    async def settle(self, task: Task, verdict: Verdict) -> str:
        """Record the verdict in Redis; returns the final outcome."""
        if verdict.outcome == "success":
            future = asyncio.get_running_loop().create_future()
            self._acks.setdefault(task.queue, []).append(
                ((task.id, task.fence, task.retention, verdict.result), future))
            self._more.set()
            accepted = await future
        elif verdict.outcome == "retry":
            accepted = await self._persist(lambda: self.broker.retry(
                task.queue, task.id, task.fence, verdict.delay, verdict.error_text))
        else:
            accepted = await self._persist(lambda: self.broker.kill(
                task.queue, task.id, task.fence, verdict.error_text))
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
                q, [(t.id, t.fence) for t in g]), attempts=5)
            for task, ok in zip(group, accepted or [False] * len(group)):
                self.report(task, "requeued" if ok else "lease_lost", None)

    def report(self, task: Task, outcome: str, error: BaseException | None) -> None:
        for hook in self.hooks:
            try:
                hook(task, outcome, error)
            except Exception:
                log.exception("outcome hook %r failed", hook)

    async def close(self, timeout: float) -> None:
        """Flush what is queued, then stop; give up on Redis after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._acks and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self._gave_up = True
        if self._flusher is not None:
            self._flusher.cancel()
        for entries in self._acks.values():
            for _, future in entries:
                if not future.done():
                    future.set_result(False)

    async def _flush_forever(self) -> None:
        failures = 0
        while True:
            await self._more.wait()
            self._more.clear()
            while self._acks:
                batch, self._acks = self._acks, {}
                try:
                    results = await self.broker.ack(
                        {q: [item for item, _ in entries] for q, entries in batch.items()})
                except BrokerError as exc:
                    failures += 1
                    if failures == 1:
                        log.warning("cannot record completions: %s; retrying", exc)
                    for queue, entries in batch.items():
                        self._acks[queue] = entries + self._acks.get(queue, [])
                    await asyncio.sleep(_backoff(failures))
                    continue
                failures = 0
                for queue, entries in batch.items():
                    for (_, future), ok in zip(entries, results[queue]):
                        if not future.done():
                            future.set_result(ok)

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
                await asyncio.sleep(_backoff(failures))


def _backoff(failures: int) -> float:
    return min(REDIS_RETRY_MIN * 2 ** failures, REDIS_RETRY_MAX)
