"""The worker's side of Redis: take tasks under lease, keep the leases, and record how each
attempt ended. Every call after dequeue names its attempt by fencing token, so a worker
whose lease was taken over cannot settle the task a second time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from obsq.broker.calls import RedisCalls, ScriptCall
from obsq.broker.records import Attempt, Completions, Fetched, FetchedTask
from obsq.broker.scripts import FULL_ERROR_BYTES, FULL_NOTE, FULL_TEXT_HOLD, scripts
from obsq.broker.wire import REPLIES, argv, as_count, as_text
from obsq.names import SEPARATOR, queue_of
from obsq.settings import ATTEMPTS_PER_CALL

log = logging.getLogger("obsq")
RETRY_EXPIRED = 3  # retry.lua's reply when the task expired instead
FAILURE_CALLS = 8  # retry and fail calls a worker sends at once (see _failure_call)
# A task handed on is due again after a tenth of the time since its first hand-on, within
# these bounds (seconds): soon during a deploy, once a minute when no worker has its type.
UNKNOWN_TYPE_DELAY, UNKNOWN_TYPE_MAX_DELAY = 1.0, 60.0


class Working(RedisCalls):
    async def dequeue(self, queue: str, count: int, worker_id: str, lease_seconds: float,
                      completions: Completions | None = None, resent: bool = False,
                      limits: bytes = b"", floor: int | None = None
                      ) -> tuple[dict[str, list[bool]], Fetched]:
        """Up to `count` tasks under lease, in the same round trip as the ack of
        `completions` (see ack). `limits`: the route limits to apply; `floor`: a partition's
        fetch takes no task ranked after it (dequeue.lua)."""
        calls = self._ack_calls(completions or {}, worker_id, resent)
        calls.append(self._dequeue_call(queue, count, worker_id, lease_seconds, limits,
                                        floor))
        asked_at = time.monotonic()
        *acked, fetched = await self._scripts(calls)
        return (self._ack_results(completions or {}, acked),
                self._parse_dequeue(queue, fetched, asked_at))

    async def ack(self, completions: Completions, worker_id: str, resent: bool = False
                  ) -> dict[str, list[bool]]:
        """Record successful attempts -> per queue, accepted flags (False: the fencing token
        is stale). `resent`: an earlier send of these may have been applied before its reply
        was lost; an attempt that already completed its task then counts as accepted."""
        return self._ack_results(completions, await self._scripts(
            self._ack_calls(completions, worker_id, resent)))

    def _ack_calls(self, completions: Completions, worker_id: str, resent: bool
                   ) -> list[ScriptCall]:
        calls: list[ScriptCall] = []
        for queue, items in completions.items():
            k = self.keys(queue)
            for start in range(0, len(items), ATTEMPTS_PER_CALL):
                args = argv("ack", [
                    (c.attempt.task_id, c.attempt.fence, int(c.retention * 1000), c.result,
                     "1" if c.id_chosen else "", c.attempt.type, c.attempt.slot,
                     c.attempt.ordering_key) for c in items[start:start + ATTEMPTS_PER_CALL]],
                    worker=worker_id, resent=1 if resent else 0,
                    window=int(self.dedup_window * 1000), share=self.memory_share)
                calls.append(("ack", (k.lease, k.completed, k.active, k.watched), args))
        return calls

    @staticmethod
    def _ack_results(completions: Completions, replies: Sequence[Any]
                     ) -> dict[str, list[bool]]:
        flags = iter(bool(x) for reply in replies for x in reply)
        return {queue: [next(flags) for _ in items] for queue, items in completions.items()}

    def _dequeue_call(self, queue: str, count: int, worker_id: str, lease_seconds: float,
                      limits: bytes, floor: int | None = None) -> ScriptCall:
        k = self.keys(queue)
        return ("dequeue", (k.pending, k.lease, k.wake, k.paused, k.active, k.fence),
                argv("dequeue", lease=int(lease_seconds * 1000), count=count, worker=worker_id,
                     limits=limits, aging=int(self.priority_aging * 1000),
                     ahead="1" if SEPARATOR in queue else "",  # a partition's: see Fetched
                     floor="" if floor is None else floor,
                     weights=self.fairness_weights.get(queue_of(queue), b"")))

    def _parse_dequeue(self, queue: str, reply: list[Any], asked_at: float) -> Fetched:
        if reply[1]:
            log.warning("%d id(s) in queue %s had no task data (deleted outside obsq); "
                        "skipped", reply[1], queue)
        shape = REPLIES["dequeue"]
        aside = reply[shape.head.index("aside")]
        if aside:
            self.said_aside(queue, "dequeue", aside)
        end = len(shape.head) + reply[shape.head.index("count")] * len(shape.item)
        tasks = [_read_task(reply, i) for i in range(len(shape.head), end, len(shape.item))]
        held = tuple((as_text(t), as_text(why)) for t, why in shape.tail_of(reply))
        ahead = reply[shape.head.index("ahead")]
        expired = tuple(FetchedTask(as_text(e.id), 0, as_text(e.type), b"", e.headers or b"",
                                    b"", as_count(e.retried), 0, False, "", False, "",
                                    priority=as_count(e.priority))
                        for e in shape.rows_of("expired", shape.head_of(reply).expired or ()))
        return Fetched(reply[0], tasks, held, asked_at, int(ahead) if ahead else None, expired)

    async def wait_and_dequeue(self, queues: Sequence[str], timeout: float, queue: str,
                               count: int, worker_id: str, lease_seconds: float,
                               limits: bytes = b"") -> tuple[str | None, Fetched]:
        """Block on the wake lists (and the worker's own, see `interrupt_wait`) with the
        dequeue of `queue` queued right behind on the same connection: Redis runs it the
        moment the BLPOP returns, so an idle worker gets its task in the round trip that
        wakes it. Returns (woken, fetched). On a Cluster, whose keys live in different
        slots, or with a clock the scripts do not read themselves (the dequeue would carry
        the time of the wait's start), it only waits; the caller fetches."""
        wake = {self.keys(q).wake: q for q in queues}
        if not self.is_cluster:  # where interrupt_wait can reach it
            wake[self.global_keys.wake(worker_id)] = ""
        if self.is_cluster or not self.clock.read_by_scripts:
            woken = await self._blpop_any("wait_for_work", list(wake), timeout)
            return _woken_queue(wake, woken), Fetched(0, [])
        name, keys, args = self._dequeue_call(queue, count, worker_id, lease_seconds, limits)
        asked_at = time.monotonic()
        woken, fetched = await self._guard("wait_for_work", self.runner.calls(
            [(scripts()[name], keys, args)], before=("BLPOP", *wake, timeout)), wait=timeout)
        if isinstance(woken, Exception):
            raise self.failed("wait_for_work", woken)
        if isinstance(fetched, Exception):
            raise self.failed(name, fetched)
        return _woken_queue(wake, woken), self._parse_dequeue(queue, fetched, asked_at)

    async def isolate(self, queue: str, attempt: Attempt, worker_id: str) -> bool:
        """Record that a suspect's attempt starts alone in its worker (isolate.lua); False
        when the attempt no longer holds the task."""
        return bool(await self._script("isolate", (self.keys(queue).active,), argv(
            "isolate", worker=worker_id, id=attempt.task_id, fence=attempt.fence)))

    async def interrupt_wait(self, worker_id: str) -> None:
        """End the worker's wait_and_dequeue at once (the tasks it takes are returned)."""
        await self._script("interrupt", (self.global_keys.wake(worker_id),),
                           argv("interrupt", ttl=10_000))

    async def retry(self, queue: str, attempt: Attempt, worker_id: str, delay: float,
                    error: str, traceback: str = "") -> str:
        """The attempt failed and may be retried -> 'retry' (scheduled again), 'expired' (its
        retry would start after the task's expiry: it ended dead, TaskExpired), or '' when
        the fencing token is stale."""
        k = self.keys(queue)
        error, traceback = self._failure_texts(error, traceback)
        keys = (k.lease, k.retry, k.pending, k.wake, k.active)
        reply = await self._failure_call("retry", keys, argv(
            "retry", worker=worker_id, id=attempt.task_id, fence=attempt.fence,
            delay=int(delay * 1000), error=error, traceback=traceback, type=attempt.type,
            slot=attempt.slot, share=self.memory_share))
        return "" if not reply else "expired" if reply == RETRY_EXPIRED else "retry"

    async def defer_unknown(self, queue: str, attempt: Attempt, worker_id: str, error: str,
                            max_age: float) -> str:
        """A task of a type this worker has no handler for goes back for another worker,
        its retry count unchanged (defer_unknown.lua) -> the state it is left in: 'scheduled',
        'dead' (handed on for longer than `max_age`) or 'cancelled'; '' when the fencing
        token is stale."""
        k = self.keys(queue)
        state = await self._script("defer_unknown", (k.lease, k.scheduled, k.dead, k.active),
                                   argv("defer_unknown", worker=worker_id, id=attempt.task_id,
                                        fence=attempt.fence,
                                        shortest=int(UNKNOWN_TYPE_DELAY * 1000),
                                        longest=int(UNKNOWN_TYPE_MAX_DELAY * 1000),
                                        max_age=int(max_age * 1000), error=error,
                                        type=attempt.type, slot=attempt.slot,
                                        ordering=attempt.ordering_key))
        return as_text(state) if state else ""

    async def fail(self, queue: str, attempt: Attempt, worker_id: str, error: str,
                   traceback: str = "") -> bool:
        """The attempt failed for good: the task goes to the dead set."""
        k = self.keys(queue)
        error, traceback = self._failure_texts(error, traceback)
        return bool(await self._failure_call("fail", (k.lease, k.dead, k.active), argv(
            "fail", worker=worker_id, id=attempt.task_id, fence=attempt.fence, error=error,
            traceback=traceback, type=attempt.type, slot=attempt.slot,
            ordering=attempt.ordering_key, share=self.memory_share)))

    _texts_cut_until = 0.0  # Redis said it was above the producers' share: cut until then

    def _failure_texts(self, error: str, traceback: str) -> tuple[str, str]:
        """A failure's error and traceback as sent: while Redis was lately above the
        producers' share, the script would keep only the start of the error, so only that
        travels (each connection's buffers in Redis hold what it was sent: with many slots
        failing at once, whole tracebacks would fill Redis's memory on their way)."""
        if time.monotonic() >= self._texts_cut_until:
            return error, traceback
        start = error.encode()[:FULL_ERROR_BYTES - len(FULL_NOTE)].decode(errors="ignore")
        return start + FULL_NOTE, ""

    _failure_gate: asyncio.Semaphore | None = None

    async def _failure_call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> int:
        """A retry or fail call -> its reply (0: stale); a reply of 2 (the error was cut
        short) starts a cut spell. At most FAILURE_CALLS at once: when many slots fail
        together, each call on a connection of its own would open the pool's every
        connection, and Redis counts each one's buffers (17-50 KB) in its used memory, full
        or not."""
        if self._failure_gate is None:
            self._failure_gate = asyncio.Semaphore(FAILURE_CALLS)
        async with self._failure_gate:
            reply = await self._script(name, keys, args)
        if reply == 2:
            self._texts_cut_until = time.monotonic() + FULL_TEXT_HOLD
        return int(reply)

    async def cancel_attempt(self, queue: str, attempt: Attempt, worker_id: str) -> bool:
        """A running attempt its worker stopped because the task was cancelled."""
        k = self.keys(queue)
        return bool(await self._script(
            "cancel", (k.pending, k.scheduled, k.retry, k.active, k.lease),
            argv("cancel", mode="attempt", id=attempt.task_id, fence=attempt.fence,
                 worker=worker_id, type=attempt.type, slot=attempt.slot)))

    async def read_cancels(self, queues: Sequence[str], worker_id: str, timeout: float
                           ) -> list[tuple[str, str]]:
        """Block until one of the worker's running tasks is cancelled (or `timeout`):
        [(queue, task id)], every cancel waiting for it."""
        queue_of = {self.keys(q).cancels(worker_id).encode(): q for q in queues}
        first = await self._blpop_any("read_cancels", [k.decode() for k in queue_of], timeout)
        if first is None:
            return []
        cancels = [(queue_of[first[0]], as_text(first[1]))]
        pipe = self.redis.pipeline(transaction=False)
        for key in queue_of:
            pipe.lpop(key, ATTEMPTS_PER_CALL)
        for queue, more in zip(queue_of.values(),
                               await self._guard("read_cancels", pipe.execute())):
            cancels += ((queue, as_text(m)) for m in more or ())
        return cancels

    async def hand_back(self, queue: str, attempts: Sequence[Attempt], worker_id: str
                        ) -> list[bool]:
        """Return unfinished attempts to the head of pending, in their order (a worker's
        graceful drain, or its prefetch buffer given back)."""
        k = self.keys(queue)
        calls = []
        back_to_front = attempts[::-1]  # hand_back.lua: the last given is taken first
        for start in range(0, len(back_to_front), ATTEMPTS_PER_CALL):
            args = argv("hand_back", [(a.task_id, a.fence, a.type, a.slot)
                                      for a in back_to_front[start:start + ATTEMPTS_PER_CALL]],
                        worker=worker_id)
            calls.append(("hand_back", (k.lease, k.pending, k.wake, k.active), args))
        return [bool(x) for reply in await self._scripts(calls) for x in reply][::-1]

    async def release_unheld(self, queue: str, held: Sequence[Attempt], worker_id: str,
                             batch: int) -> int:
        """Hand back to pending the tasks leased to the worker in `queue` that are not among
        the attempts it holds (`held`): those of a fetch whose reply it never read
        (release_unheld.lua) -> how many. Called from the fetch loop only, before its
        next fetch, so that no fetch still under way is among them."""
        k = self.keys(queue)
        pairs = [(a.task_id, a.fence) for a in held]
        released, cursor = 0, "0"
        while True:
            r = REPLIES["release_unheld"].head_of(await self._script(
                "release_unheld", (k.lease, k.pending, k.wake, k.active),
                argv("release_unheld", pairs, worker=worker_id, batch=batch,
                     cursor=cursor)))
            if r.aside:
                self.said_aside(queue, "release_unheld", r.aside)
            released += as_count(r.released)
            cursor = as_text(r.cursor)
            if cursor == "0":
                return released

    def extend_calls(self, attempts: dict[str, list[Attempt]], lease_seconds: float,
                      worker_id: str) -> tuple[list[ScriptCall], list[str]]:
        """The calls that extend leases ({queue: attempts}), and the queue of each call."""
        calls: list[ScriptCall] = []
        queues: list[str] = []
        for queue, items in attempts.items():
            k = self.keys(queue)
            for start in range(0, len(items), ATTEMPTS_PER_CALL):
                args = argv("extend", [(a.task_id, a.fence)
                                       for a in items[start:start + ATTEMPTS_PER_CALL]],
                            lease=int(lease_seconds * 1000), worker=worker_id)
                calls.append(("extend", (k.lease, k.active), args))
                queues.append(queue)
        return calls, queues

    async def still_held(self, queue: str, attempts: Sequence[Attempt], worker_id: str
                         ) -> list[bool]:
        """Whether each attempt still holds its task (its fence and this worker recorded in
        `active`): a worker that was unresponsive asks before it starts a task it took."""
        pipe = self.redis.pipeline(transaction=False)
        for a in attempts:
            pipe.hget(self.keys(queue).active, a.task_id)
        held = await self._guard("still_held", pipe.execute())
        return [h == f"{a.fence}:{worker_id}".encode() for a, h in zip(attempts, held)]

    async def set_progress(self, queue: str, task_id: str, state: Any, ttl: float) -> None:
        await self._guard("set_progress", self.redis.set(
            self.keys(queue).progress(task_id), orjson.dumps(state), px=int(ttl * 1000)))


# How each field of a dequeued task is read, by name (wire.REPLIES["dequeue"]); the rest
# are kept as they come.
_TEXT = "{}.decode(errors='replace')"  # decoding.as_text of bytes, without its call
_READERS = {"id": _TEXT, "type": _TEXT, "retried": "as_count({})", "due_ms": "as_count({})",
            "id_chosen": "{} == b'1'", "ordering_key": _TEXT, "waited": "{} == b'1'",
            "slot": _TEXT, "binary": "{} == b'1'", "suspect": "{} == b'1'",
            "priority": "as_count({})"}


def _task_reader() -> Callable[[list[Any], int], FetchedTask]:
    """`read(reply, i)`: the task whose fields start at reply[i], written out once from the
    declaration (a loop over the fields would cost a dequeue twice the CPU per task)."""
    fields = ", ".join(_READERS.get(name, "{}").format(f"r[i + {offset}]")
                       for offset, name in enumerate(REPLIES["dequeue"].item))
    scope = {"FetchedTask": FetchedTask, "as_count": as_count}
    return eval(f"lambda r, i: FetchedTask({fields})", scope)


_read_task = _task_reader()


def _woken_queue(wake: dict[str, str], woken: Any) -> str | None:
    """The queue a BLPOP reply (key, token) names; "" for the worker's own list, None for
    no reply."""
    if woken is None:
        return None
    key = woken[0].decode() if isinstance(woken[0], bytes) else woken[0]
    return wake.get(key, "")
