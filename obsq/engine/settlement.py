"""Recording how each attempt ended, then telling the outcome hooks.

Successes ride the worker's next Redis call (`RidingAcks`): they gather until the worker
next talks to Redis and go in that same round trip. Other ends are recorded at once; a
Redis that is away is retried with backoff. The outcome hooks then hear what happened: the
verdict when Redis recorded it, `lease_lost` when the attempt's fencing token had gone
stale (its lease was taken over), `unrecorded` when the worker stopped before Redis could
be reached (the task runs again once its worker is known lost). A task of a type the
worker has no handler for is handed on (`handed_on`, said once per type), or ends `dead`
once it has been handed on for longer than `unknown_type_max_age`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from obsq.app import Hooks
from obsq.background import RedisRetry
from obsq.broker import Attempt, Broker, Completion, Completions
from obsq.engine.execution import Verdict
from obsq.engine.liveness import Claims
from obsq.errors import EXPIRED_PREFIX, BrokerError, Retry, TaskExpired
from obsq.task import Task

log = logging.getLogger("obsq")
T = TypeVar("T")
# What a call carrying completions returns: the accepted flags per queue, and its own value.
CarryingCall = Callable[[Completions, bool], Awaitable[tuple[dict[str, list[bool]], T]]]


def attempt_of(task: Task) -> Attempt:
    """The attempt as the scripts that end it name it."""
    state = task._attempt
    return Attempt(task.id, state.fence, task.type, state.slot, task.ordering_key)


class _Ack:
    __slots__ = ("completion", "pending", "recorded", "resent")

    def __init__(self, completion: Completion, recorded: Callable[[bool | None], None]
                 ) -> None:
        self.completion = completion
        self.recorded = recorded  # told once: True, False (lease lost) or None (gave up)
        self.pending = True
        self.resent = False  # an earlier send may have reached Redis before it failed

    def tell(self, ok: bool | None) -> None:
        """Told inside the call that carried it, beside the other completions of that
        call: a failure here is logged, never raised into that call."""
        if self.pending:
            self.pending = False
            try:
                self.recorded(ok)
            except Exception:
                log.exception("settling task %s failed", self.completion.attempt.task_id)


class RidingAcks:
    """The successes gathered for the worker's next Redis call, which carries them: the
    next fetch (`ride`), or an ack of their own when no fetch comes within a linger
    (`wait_for_room`, `flush`). No timer and no task per success: a busy worker pays one
    round trip for many, an idle one no delay. A call that fails keeps them for the next
    one, marked resent (a resent completion whose first send was applied is recognised by
    its fencing token). Each is told how Redis took it, once: recorded, refused (its lease
    was lost) or given up (`close`, the worker stops)."""

    def __init__(self, broker: Broker, worker_id: str) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self._acks: dict[str, list[_Ack]] = {}  # by queue
        self.waiting = asyncio.Event()  # set while some wait for a call
        self.gave_up = False  # closed: nothing more is sent

    def add(self, queue: str, completion: Completion,
            recorded: Callable[[bool | None], None]) -> None:
        self._acks.setdefault(queue, []).append(_Ack(completion, recorded))
        self.waiting.set()

    async def ride(self, call: CarryingCall[T]) -> T:
        """Run the worker's next Redis call with the completions gathered so far riding
        along: `call(completions, resent)` returns (accepted flags per queue, its value)."""
        taken, self._acks = self._acks, {}
        self.waiting.clear()
        completions = {q: [a.completion for a in acks] for q, acks in taken.items()}
        resent = any(a.resent for acks in taken.values() for a in acks)
        try:
            accepted, value = await call(completions, resent)
        except BaseException:
            for queue, acks in taken.items():  # sent again with the next call
                for ack in acks:
                    ack.resent = True
                self._acks[queue] = acks + self._acks.get(queue, [])
            if self._acks:
                self.waiting.set()
            raise
        for queue, acks in taken.items():
            for ack, ok in zip(acks, accepted[queue]):
                ack.tell(ok)
        return value

    async def flush(self) -> None:
        """Send the gathered completions on their own (when no fetch is due)."""
        if self._acks:
            await self.ride(self._ack_only)

    async def _ack_only(self, completions: Completions, resent: bool
                        ) -> tuple[dict[str, list[bool]], None]:
        return await self.broker.ack(completions, self.worker_id, resent), None

    async def wait_for_room(self, event: asyncio.Event, linger: float,
                            timeout: float | None = None) -> None:
        """Wait for `event` (room for the worker's next fetch), `timeout` at most.
        Completions gathered before it wait at most `linger` for that fetch, then go on
        their own."""
        if not self.waiting.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
            return
        try:
            await asyncio.wait_for(event.wait(), linger)
        except asyncio.TimeoutError:
            await self.flush()

    async def close(self, timeout: float) -> None:
        """Flush what is left, retrying while Redis is away for up to `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        retry = RedisRetry("recording completions")
        while self._acks:
            try:
                await self.flush()
            except BrokerError as exc:
                pause = retry.failed(exc)
                if loop.time() >= deadline:
                    log.error("gave up recording %d completion(s): %s; they will run again "
                              "once this worker is known lost",
                              sum(map(len, self._acks.values())), exc)
                    break
                await asyncio.sleep(pause)
        self.gave_up = True
        acks, self._acks = self._acks, {}
        for gathered in acks.values():
            for ack in gathered:
                ack.tell(None)


class Settler:
    def __init__(self, broker: Broker, worker_id: str,
                 hooks: Hooks[[Task, str, BaseException | None]], *,
                 unknown_type_max_age: float, claims: Claims | None = None) -> None:
        """`claims`: the worker's, told when an attempt's end is sent and recorded (its
        lease is extended until then, and not reported lost meanwhile)."""
        self.broker = broker
        self.worker_id = worker_id
        self.hooks = hooks
        self.unknown_type_max_age = unknown_type_max_age
        self._handed_on_types: set[str] = set()  # said once each
        self.claims = claims or Claims()
        self.acks = RidingAcks(broker, worker_id)  # successes riding the next fetch
        self.direct = False  # draining: send each completion at once, no fetch carries it

    def settle_later(self, task: Task, verdict: Verdict, then: Callable[[], None]) -> bool:
        """A success, gathered for the next call that carries completions, with no wait of
        its own (the busy worker's common end: no coroutine nor future per task); `then()`
        once Redis recorded it, or the worker gave up; it and the outcome hooks run in the
        task's context (contextvars), as they would after an awaited settle. False, and
        nothing done, when it must be settled at once (`settle`): not a success, or
        draining."""
        if verdict.outcome != "success" or self.direct:
            return False
        self.claims.ending(task.kept_in, task.id)

        def recorded(ok: bool | None) -> None:
            self.claims.released(task.kept_in, task.id, task._attempt.fence)
            self._told(task, verdict, ok)
            then()

        context = contextvars.copy_context()  # the hooks run as they would in the task
        self._gather(task, verdict, lambda ok: context.run(recorded, ok))
        return True

    def _gather(self, task: Task, verdict: Verdict,
                recorded: Callable[[bool | None], None]) -> None:
        self.acks.add(task.kept_in, Completion(attempt_of(task), task.retention, verdict.result,
                                               task._attempt.id_chosen), recorded)

    async def settle(self, task: Task, verdict: Verdict) -> str:
        """Record the verdict in Redis; returns the final outcome."""
        self.claims.ending(task.kept_in, task.id)
        try:
            return await self._settle(task, verdict)
        finally:
            self.claims.released(task.kept_in, task.id, task._attempt.fence)

    async def _settle(self, task: Task, verdict: Verdict) -> str:
        attempt = attempt_of(task)
        if verdict.outcome == "success":
            future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()

            def tell(ok: bool | None) -> None:
                if not future.done():
                    future.set_result(ok)

            self._gather(task, verdict, tell)
            if self.direct:
                await self._persist(self.acks.flush)
            recorded = await future
        elif verdict.outcome == "cancelled":
            recorded = await self._persist(lambda: self.broker.cancel_attempt(
                task.kept_in, attempt, self.worker_id))
        elif verdict.outcome == "handed_on":
            recorded, verdict = await self._defer_unknown(task, verdict)
        elif verdict.outcome == "retry":
            ended = await self._persist(lambda: self.broker.retry(
                task.kept_in, attempt, self.worker_id, verdict.delay, verdict.error_text,
                verdict.traceback_text))
            if ended == "expired":  # its retry would have started after its expiry
                verdict = Verdict("expired", error=TaskExpired(task.id, f"{EXPIRED_PREFIX} its "
                                  f"retry would have started after its expiry; its last "
                                  f"attempt failed: {verdict.error_text}"))
            recorded = None if ended is None else bool(ended)
        else:
            recorded = await self._persist(lambda: self.broker.fail(
                task.kept_in, attempt, self.worker_id, verdict.error_text,
                verdict.traceback_text))
        return self._told(task, verdict, recorded)

    def _told(self, task: Task, verdict: Verdict, recorded: bool | None) -> str:
        """Log what needs saying of how Redis took the verdict, tell the outcome hooks;
        the final outcome."""
        outcome = {True: verdict.outcome, False: "lease_lost", None: "unrecorded"}[recorded]
        if recorded is False and self.claims.data_lost_at >= task._attempt.asked_at:
            log.warning("task %s (%s) finished after Redis lost its data (restarted empty, or "
                        "flushed) while it ran: its %s was not recorded", task.id, task.type,
                        verdict.outcome)
        elif recorded is False:
            log.warning("task %s (%s) finished after its lease was taken over; its %s was "
                        "refused", task.id, task.type, verdict.outcome)
        elif recorded and verdict.outcome == "cancelled":
            log.info("task %s (%s) cancelled while it ran", task.id, task.type)
        elif recorded and verdict.outcome == "retry" and type(verdict.error) is Retry:
            log.info("task %s (%s) asked to run again in %.1f s", task.id, task.type,
                     verdict.delay)  # task.retry_in(): the handler's choice, no failure
        elif recorded and verdict.outcome == "handed_on":
            if task.type not in self._handed_on_types:
                self._handed_on_types.add(task.type)
                log.warning("no handler for task type %r in this worker: its tasks are "
                            "handed on to workers that have one, no retry spent, and end "
                            "dead if none takes them within %g s", task.type,
                            self.unknown_type_max_age)
        elif recorded and verdict.outcome == "expired":
            log.warning("%s; moved to dead", verdict.error)
        elif recorded and verdict.outcome != "success":
            then = (f"will retry in {verdict.delay:.1f} s" if verdict.outcome == "retry"
                    else "moved to dead")
            where = verdict.raised_at
            log.warning("task %s (%s) failed%s, %s: %s", task.id, task.type,
                        f" at {where}" if where else "", then, verdict.error_text)
        self.report(task, outcome, verdict.error)
        return outcome

    async def _defer_unknown(self, task: Task, verdict: Verdict) -> tuple[bool | None, Verdict]:
        """Hand a task of an unknown type on -> (recorded, the verdict Redis applied: still
        handed_on, or dead past the age, or cancelled)."""
        state = await self._persist(lambda: self.broker.defer_unknown(
            task.kept_in, attempt_of(task), self.worker_id, verdict.error_text,
            self.unknown_type_max_age))
        if state is None:
            return None, verdict
        if state in ("dead", "cancelled"):
            verdict = Verdict(state, error=verdict.error)
        return bool(state), verdict

    async def hand_back(self, tasks: list[Task]) -> int:
        """Return unfinished attempts to pending at once, in their order (graceful
        shutdown, or a prefetch buffer given back); how many went back (one that ended
        meanwhile, cancelled or its lease lost, does not)."""
        handed = 0
        by_queue: dict[str, list[Task]] = {}
        for task in tasks:
            by_queue.setdefault(task.kept_in, []).append(task)
        for queue, group in by_queue.items():
            for task in group:
                self.claims.ending(queue, task.id)
            accepted = await self._persist(partial(
                self.broker.hand_back, queue, [attempt_of(t) for t in group], self.worker_id),
                attempts=5)
            for task in group:
                self.claims.released(queue, task.id, task._attempt.fence)
            for task, ok in zip(group, accepted or [None] * len(group)):
                self.report(task, {True: "requeued", False: "lease_lost",
                                   None: "unrecorded"}[ok], None)
                handed += bool(ok)
        return handed

    def report(self, task: Task, outcome: str, error: BaseException | None) -> None:
        self.hooks(task, outcome, error)

    async def _persist(self, call: Callable[[], Awaitable[Any]],
                       attempts: int | None = None) -> Any:
        """Retry a settling call while Redis is away; None once the worker gives up (a
        re-sent call whose first send was applied is recognised by its fencing token)."""
        retry = RedisRetry("recording an outcome")
        while True:
            try:
                return await call()
            except BrokerError as exc:
                pause = retry.failed(exc)
                if self.acks.gave_up or (attempts is not None and retry.failures >= attempts):
                    log.error("gave up recording an outcome: %s; the task will run again "
                              "once this worker is known lost", exc)
                    return None
                await asyncio.sleep(pause)
