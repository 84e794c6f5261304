"""The broker: one method per state change, each one Lua script or one plain command.

This is the only code in obsq that speaks Redis (with calls.py, which says how).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from obsq.broker.calls import SCRIPTS
from obsq.broker.inspection import Inspection
from obsq.broker.keys import TASK_STATES
from obsq.broker.scripts import is_noscript
from obsq.task import TaskMessage

# queue -> [(id, fence, retention_s, result, unique digest or "")]
AckBatches = dict[str, list[tuple[str, int, float, bytes, str]]]
log = logging.getLogger("obsq")

# One attempt handed to a worker: id, fence, type, payload, headers, options, retried, due_ms,
# unique digest.
RawTask = tuple[str, int, str, bytes, bytes, bytes, int, int, str]


class Broker(Inspection):
    # -- producing ------------------------------------------------------------------------

    async def register_queues(self, queues: Iterable[str]) -> None:
        await self._guard("register_queues", self.redis.sadd(self.global_keys.queues, *queues))

    async def enqueue(self, queue: str, messages: Sequence[TaskMessage]) -> list[str]:
        """Returns per message '' (enqueued), 'id' (id taken) or 'unique:<holder id>'."""
        k = self.keys(queue)
        batch = orjson.dumps([
            (m.id, m.type, m.payload.decode(), m.encoded_headers().decode(),
             m.encoded_options().decode(), int(m.due_at * 1000), m.unique_key,
             int(m.unique_for * 1000))
            for m in messages])
        result = await self._script("enqueue", (k.pending, k.scheduled, k.wake), (0, batch))
        return [s.decode() for s in result]

    # -- working --------------------------------------------------------------------------

    async def dequeue(self, queue: str, count: int, worker_id: str, lease_seconds: float
                      ) -> tuple[int, list[RawTask]]:
        """Up to `count` tasks under lease; returns Redis's clock (ms) and the tasks."""
        reply = await self._script(*self._dequeue_call(queue, count, worker_id, lease_seconds))
        return self._parse_dequeue(queue, reply)

    async def ack(self, batches: AckBatches, worker_id: str) -> dict[str, list[bool]]:
        """Complete attempts: {queue: [(id, fence, retention_s, result, unique)]} -> accepted
        flags (False: the fencing token is stale)."""
        results = await self._scripts(self._ack_calls(batches, worker_id))
        return {q: [bool(x) for x in r] for q, r in zip(batches, results)}

    async def ack_and_dequeue(self, batches: AckBatches, queue: str, count: int, worker_id: str,
                              lease_seconds: float
                              ) -> tuple[dict[str, list[bool]], int, list[RawTask]]:
        """ack() and dequeue() in one round trip: what a busy worker does in each cycle."""
        calls = self._ack_calls(batches, worker_id)
        calls.append(self._dequeue_call(queue, count, worker_id, lease_seconds))
        *acked, fetched = await self._scripts(calls)
        now, tasks = self._parse_dequeue(queue, fetched)
        return {q: [bool(x) for x in r] for q, r in zip(batches, acked)}, now, tasks

    def _dequeue_call(self, queue: str, count: int, worker_id: str, lease_seconds: float
                      ) -> tuple[str, Sequence[str], Sequence[Any]]:
        k = self.keys(queue)
        return ("dequeue", (k.pending, k.lease, k.wake, k.paused, k.active, k.fence),
                (0, int(lease_seconds * 1000), count, worker_id))

    def _parse_dequeue(self, queue: str, reply: list[Any]) -> tuple[int, list[RawTask]]:
        if reply[1]:
            log.warning("%d id(s) in queue %s had no task data (deleted outside obsq); "
                        "skipped", reply[1], queue)
        tasks = [
            (reply[i].decode(errors="replace"), reply[i + 1],
             reply[i + 2].decode(errors="replace"), reply[i + 3],
             reply[i + 4], reply[i + 5], _count(reply[i + 6]), _count(reply[i + 7]),
             reply[i + 8].decode(errors="replace"))
            for i in range(2, len(reply), 9)
        ]
        return reply[0], tasks

    def _ack_calls(self, batches: AckBatches, worker_id: str
                   ) -> list[tuple[str, Sequence[str], Sequence[Any]]]:
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        for queue, items in batches.items():
            k = self.keys(queue)
            args: list[Any] = [0, worker_id]
            for task_id, fence, retention, result, unique in items:
                args += (task_id, fence, int(retention * 1000), result, unique)
            calls.append(("ack", (k.lease, k.completed, k.active, k.watched), args))
        return calls

    async def retry(self, queue: str, task_id: str, fence: int, worker_id: str, delay: float,
                    error: str, traceback: str = "") -> bool:
        k = self.keys(queue)
        return bool(await self._script(
            "retry", (k.lease, k.retry, k.pending, k.wake, k.active),
            (0, worker_id, task_id, fence, int(delay * 1000), error, traceback)))

    async def kill(self, queue: str, task_id: str, fence: int, worker_id: str,
                   error: str, traceback: str = "") -> bool:
        k = self.keys(queue)
        return bool(await self._script("kill", (k.lease, k.dead, k.active, k.watched),
                                       (0, worker_id, task_id, fence, error, traceback)))

    async def requeue(self, queue: str, attempts: Sequence[tuple[str, int]],
                      worker_id: str) -> list[bool]:
        k = self.keys(queue)
        args: list[Any] = [0, worker_id]
        for task_id, fence in attempts:
            args += (task_id, fence)
        return [bool(x) for x in await self._script(
            "requeue", (k.lease, k.pending, k.wake, k.active), args)]

    async def extend(self, attempts: dict[str, list[tuple[str, int]]], lease_seconds: float,
                     worker_id: str) -> dict[str, list[str]]:
        """Extend leases: {queue: [(id, fence)]} -> {queue: ids whose lease was lost}."""
        calls = []
        for queue, items in attempts.items():
            k = self.keys(queue)
            args: list[Any] = [0, int(lease_seconds * 1000), worker_id]
            for task_id, fence in items:
                args += (task_id, fence)
            calls.append(("extend", (k.lease, k.active), args))
        results = await self._scripts(calls)
        return {q: [i.decode() for i in r] for q, r in zip(attempts, results)}

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a producer signals one of `queues` (False after `timeout`). One BLPOP
        on all wake lists; on a Cluster, whose keys live in different slots, one per queue."""
        if not self.is_cluster or len(queues) == 1:
            reply = await self._guard("wait_for_work", self.redis.blpop(
                [self.keys(q).wake for q in queues], timeout=timeout))
            return reply is not None
        waiters = [asyncio.ensure_future(self.wait_for_work([q], timeout)) for q in queues]
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return any(w.result() for w in done)

    async def wait_and_dequeue(self, queues: Sequence[str], timeout: float, queue: str,
                               count: int, worker_id: str, lease_seconds: float
                               ) -> tuple[bool, int, list[RawTask]]:
        """Block on the wake lists (and the worker's own, see `interrupt_wait`) with the
        dequeue of `queue` queued right behind on the same connection: Redis runs it the
        moment the BLPOP returns, so an idle worker gets its task in the round trip that
        wakes it. Returns (woken, Redis clock in ms, tasks). On a Cluster, whose keys live
        in different slots, it only waits; the caller fetches."""
        if self.is_cluster:
            return await self.wait_for_work(queues, timeout), 0, []
        wake = [self.keys(q).wake for q in queues] + [self.global_keys.wake(worker_id)]
        name, keys, args = self._dequeue_call(queue, count, worker_id, lease_seconds)
        pipe = self.redis.pipeline(transaction=False)
        pipe.blpop(wake, timeout=timeout)
        pipe.evalsha(SCRIPTS[name].sha, len(keys), *keys, *args)
        woken, fetched = await self._guard("wait_for_work", pipe.execute(raise_on_error=False))
        if isinstance(woken, Exception):
            raise self._failed("wait_for_work", woken)
        if is_noscript(fetched):  # Redis restarted empty: load it and fetch again
            fetched = await self._script(name, keys, args)
        elif isinstance(fetched, Exception):
            raise self._failed(name, fetched)
        now, tasks = self._parse_dequeue(queue, fetched)
        return woken is not None, now, tasks

    async def interrupt_wait(self, worker_id: str) -> None:
        """End the worker's wait_and_dequeue at once (the tasks it takes are returned)."""
        key = self.global_keys.wake(worker_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(key, 1)
        pipe.expire(key, 10)
        await self._guard("wait_for_work", pipe.execute())

    async def set_progress(self, queue: str, task_id: str, state: Any, ttl: float) -> None:
        await self._guard("set_progress", self.redis.set(
            self.keys(queue).progress(task_id), orjson.dumps(state), px=int(ttl * 1000)))

    # -- workers and maintenance ----------------------------------------------------------

    async def heartbeat(self, worker_id: str, description: dict[str, Any], ttl: float) -> None:
        g = self.global_keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(g.workers, {worker_id: int(time.time() * 1000)})
        pipe.set(g.worker(worker_id), orjson.dumps(description), px=int(ttl * 1000))
        if description.get("queues"):  # again each time: a Redis that restarted empty has
            pipe.sadd(g.queues, *description["queues"])  # lost the set the sweeps go through
        await self._guard("heartbeat", pipe.execute())

    async def deregister(self, worker_id: str) -> None:
        g = self.global_keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(g.workers, worker_id)
        pipe.delete(g.worker(worker_id), g.wake(worker_id))
        await self._guard("deregister", pipe.execute())

    async def workers(self) -> list[dict[str, Any]]:
        """Descriptions of the workers whose heartbeat is current."""
        g = self.global_keys
        ids = await self._guard("workers", self.redis.zrange(g.workers, 0, -1))
        if not ids:
            return []
        values = await self._get_many("workers", [g.worker(i.decode()) for i in ids])
        return [orjson.loads(v) for v in values if v]

    async def lost_workers(self, silent_for: float) -> list[str]:
        """Workers registered in the heartbeat set whose heartbeat key has expired."""
        g = self.global_keys
        cutoff = int((time.time() - silent_for) * 1000)
        candidates = await self._guard("lost_workers",
                                       self.redis.zrangebyscore(g.workers, "-inf", cutoff))
        if not candidates:
            return []
        alive = await self._get_many("lost_workers", [g.worker(c.decode()) for c in candidates])
        return [c.decode() for c, a in zip(candidates, alive) if a is None]

    async def forget_workers(self, worker_ids: Sequence[str]) -> None:
        await self._guard("forget_workers", self.redis.zrem(self.global_keys.workers,
                                                            *worker_ids))

    async def recover(self, queue: str, max_recoveries: int, batch: int,
                      lost_workers: Sequence[str] = ()) -> tuple[int, int]:
        """Expired leases (or, given lost workers, their attempts) -> (requeued, killed)."""
        k = self.keys(queue)
        requeued, killed = await self._script(
            "recover", (k.lease, k.pending, k.dead, k.wake, k.active, k.watched),
            (0, max_recoveries, batch, *lost_workers))
        return requeued, killed

    async def forward(self, queue: str, state: str, batch: int) -> tuple[int, float | None]:
        """Due tasks of the scheduled or retry set to pending -> (moved, next due in s)."""
        k = self.keys(queue)
        moved, next_due = await self._script("forward", (k.by_state(state), k.pending, k.wake),
                                             (0, batch))
        next_due = float(next_due)
        return moved, (next_due / 1000 if next_due >= 0 else None)

    async def cleanup(self, queue: str, dead_max_age: float, dead_max_count: int,
                      batch: int) -> int:
        k = self.keys(queue)
        return await self._script("cleanup", (k.completed, k.dead),
                                  (0, int(dead_max_age * 1000), dead_max_count, batch))

    async def try_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or keep a short lock so one process at a time runs a maintenance sweep."""
        key = self.global_keys.lock(name)
        ms = int(ttl * 1000)
        if await self._guard("lock", self.redis.set(key, owner, nx=True, px=ms)):
            return True
        holder = await self._guard("lock", self.redis.get(key))
        if holder == owner.encode():
            await self._guard("lock", self.redis.pexpire(key, ms))
            return True
        return False

    async def release_lock(self, name: str, owner: str) -> None:
        key = self.global_keys.lock(name)
        if await self._guard("lock", self.redis.get(key)) == owner.encode():
            await self._guard("lock", self.redis.delete(key))

    async def last_runs(self, entry_ids: Sequence[str]) -> dict[str, float]:
        if not entry_ids:
            return {}
        values = await self._get_many("scheduler",
                                      [self.global_keys.schedule(e) for e in entry_ids])
        return {e: float(v) for e, v in zip(entry_ids, values) if v is not None}

    async def set_last_run(self, entry_id: str, ts: float) -> None:
        await self._guard("scheduler", self.redis.set(self.global_keys.schedule(entry_id),
                                                      repr(ts)))

    # -- inspecting and repairing ---------------------------------------------------------

    async def queues(self) -> list[str]:
        members = await self._guard("queues", self.redis.smembers(self.global_keys.queues))
        return sorted(m.decode() for m in members)

    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Depth by state, latency (s) and pause flag of each queue, one round trip."""
        calls = []
        for queue in queues:
            k = self.keys(queue)
            calls.append(("stats", (k.pending, k.lease, k.scheduled, k.retry, k.dead,
                                    k.completed, k.paused), (0,)))
        results = await self._scripts(calls) if calls else []
        stats = {}
        for queue, r in zip(queues, results):
            oldest, now = r[6], r[8]
            stats[queue] = {
                "depth": dict(zip(TASK_STATES, r[:6])),
                "latency": max(now - oldest, 0) / 1000 if oldest >= 0 else 0.0,
                "paused": bool(r[7]),
            }
        return stats

    async def find_queue(self, task_id: str) -> str | None:
        """The queue holding `task_id`, looked up across every known queue."""
        queues = await self.queues()
        if not queues:
            return None
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.exists(self.keys(queue).task(task_id))
        found = await self._guard("find_queue", pipe.execute())
        return next((q for q, f in zip(queues, found) if f), None)

    async def task_fields(self, queue: str, task_id: str
                          ) -> tuple[dict[bytes, bytes], bytes | None]:
        """The task hash (its state corrected to active while an attempt runs) and its
        progress."""
        k = self.keys(queue)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(k.task(task_id))
        pipe.get(k.progress(task_id))
        pipe.hexists(k.active, task_id)
        fields, progress, active = await self._guard("task_info", pipe.execute())
        if fields and active:
            fields[b"state"] = b"active"
        return fields, progress

    async def watch_result(self, queue: str, task_id: str) -> list[Any] | None:
        k = self.keys(queue)
        return await self._script("watch", (k.active, k.watched, k.task(task_id)),
                                  (0, task_id))

    async def wait_done(self, queue: str, task_id: str, timeout: float) -> tuple[str, bytes] | None:
        reply = await self._guard("wait_result", self.redis.brpop(
            [self.keys(queue).done(task_id)], timeout=timeout))
        if reply is None:
            return None
        state, _, value = reply[1].partition(b":")
        return state.decode(), value

    async def set_paused(self, queue: str, paused: bool) -> None:
        k = self.keys(queue)
        await self._script("pause", (k.paused, k.pending, k.wake), (0, 1 if paused else 0))


def _count(raw: bytes) -> int:
    """A numeric field of a task hash; junk written by hand reads as 0, not a crash."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0
