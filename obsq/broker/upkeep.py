"""Redis calls that keep the namespace healthy and readable: worker heartbeats, the sweeps
(recover, forward, clean up) and their locks, queue depths and the pause flag (the
Inspector's other reads and repairs are in inspection.py, schedules in scheduling.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from redis.exceptions import RedisError, ResponseError

from obsq.broker.calls import RedisCalls, ScriptCall
from obsq.broker.keys import TASK_STATES
from obsq.broker.records import QueueStats
from obsq.broker.wire import REPLIES, argv, as_count, as_text
from obsq.settings import TOP_FAIRNESS_KEYS


class Upkeep(RedisCalls):
    # -- workers --------------------------------------------------------------------------

    def heartbeat_calls(self, worker_id: str, description: dict[str, Any], ttl: float
                         ) -> list[ScriptCall]:
        """Refresh the worker's key (its TTL says it lives), its place in the registry, its
        queues and their partition counts (again each time: a Redis that restarted empty has
        lost the set the sweeps go through, and the counts producers read). Each script's
        first write cannot grow memory, so a Redis at maxmemory never refuses a heartbeat:
        that would have the worker's tasks run twice."""
        g = self.global_keys
        calls: list[ScriptCall] = [
            ("heartbeat", (g.worker(worker_id),),
             argv("heartbeat", ttl=max(int(ttl * 1000), 1), description=orjson.dumps(description))),
            ("register", (g.workers,),  # scored by its own clock: shown, never compared
             argv("register", [(int(self.clock.time() * 1000), worker_id)], kind="zset"))]
        served = description.get("served") or description.get("queues")
        if served:  # its queues' partitions, where it has them
            calls.append(self.register_queues_call(served))
        if description.get("partitions"):  # the counts its App declares, for producers
            calls.append(self.declare_partitions_call(description["partitions"]))
        return calls

    async def workers(self) -> list[dict[str, Any]]:
        """Descriptions of the workers whose heartbeat is current."""
        g = self.global_keys
        ids = await self._registry("workers", g.workers, self.redis.zrange(g.workers, 0, -1),
                                   [])
        if not ids:
            return []
        values = await self._get_many("workers", [g.worker(i.decode()) for i in ids])
        return [orjson.loads(v) for v in values if v]

    async def lost_workers(self) -> list[str]:
        """Registered workers whose heartbeat key has expired. Only Redis's key expiry
        decides: the registry's scores come from each worker's own clock."""
        g = self.global_keys
        registered = await self._registry("lost_workers", g.workers,
                                          self.redis.zrange(g.workers, 0, -1), [])
        if not registered:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for worker in registered:
            pipe.exists(g.worker(worker.decode()))
        alive = await self._guard("lost_workers", pipe.execute())
        return [w.decode() for w, a in zip(registered, alive) if not a]

    async def forget_workers(self, worker_ids: Sequence[str]) -> None:
        await self._guard("forget_workers", self.redis.zrem(self.global_keys.workers,
                                                            *worker_ids))

    # -- sweeps ---------------------------------------------------------------------------

    async def recover(self, queue: str, max_recoveries: int, batch: int,
                      lost_workers: Sequence[str] = (), cursor: str = "0"
                      ) -> tuple[int, int, str, float | None]:
        """Expired leases, or given lost workers their attempts (`batch` entries of the active
        hash scanned from `cursor`) -> (requeued, moved to dead, next cursor ("0": done),
        seconds until the queue's next lease ends, on the broker's clock; None: none)."""
        k = self.keys(queue)
        r = REPLIES["recover"].head_of(await self._script(
            "recover", (k.lease, k.pending, k.dead, k.wake, k.active),
            argv("recover", max_recoveries=max_recoveries, batch=batch, cursor=cursor,
                 lost=lost_workers)))
        if r.aside:
            self.said_aside(queue, "recover", r.aside)
        return (r.requeued, r.killed,
                r.cursor.decode() if isinstance(r.cursor, bytes) else str(r.cursor),
                int(r.ends_in) / 1000 if int(r.ends_in) >= 0 else None)

    async def forward(self, sets: Sequence[tuple[str, str]], batch: int
                      ) -> list[tuple[int, float | None]]:
        """Due tasks of each (queue, scheduled or retry) set to pending, in one round trip
        -> per set (moved, seconds until the next one is due, on Redis's clock; None when
        the set is empty). With a scheduled set, the best held task of each route limit of
        the queue is let out too, and those an earlier version held (forward.lua)."""
        calls = []
        for queue, state in sets:
            k = self.keys(queue)
            calls.append(("forward", (k.by_state(state), k.pending, k.wake),
                          argv("forward", batch=batch, scheduled=1 if state == "scheduled" else 0)))
        shape = REPLIES["forward"]
        swept = []
        for (queue, _), r in zip(sets, map(shape.head_of, await self._scripts(calls))):
            if r.aside:
                self.said_aside(queue, "forward", r.aside)
            swept.append((r.moved, int(r.next_due) / 1000 if int(r.next_due) >= 0 else None))
        return swept

    async def cleanup(self, queue: str, dead_max_age: float, dead_max_count: int,
                      batch: int) -> int:
        """Delete the tasks past their retention or dead limits, forget the remembered
        ids past the dedup window or count, and delete the junk as old as the dead tasks
        deleted -> entries removed (a full batch: call again)."""
        k = self.keys(queue)
        r = REPLIES["cleanup"].head_of(await self._script(
            "cleanup", (k.completed, k.dead, k.cancelled, k.ended),
            argv("cleanup", dead_age=int(dead_max_age * 1000), dead_count=dead_max_count,
                 batch=batch, window=int(self.dedup_window * 1000),
                 max_ids=self.dedup_max_ids)))
        if r.aside:
            self.said_aside(queue, "cleanup", r.aside)
        return r.deleted

    async def try_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or keep a short lock so one process at a time runs a sweep."""
        return bool(await self._script("lock", (self.global_keys.lock(name),),
                                       argv("lock", owner=owner, ttl=max(int(ttl * 1000), 1))))

    async def release_lock(self, name: str, owner: str) -> None:
        await self._script("lock", (self.global_keys.lock(name),),
                           argv("lock", owner=owner, ttl=0))

    # -- inspecting and repairing ---------------------------------------------------------

    async def queue_stats(self, queues: Sequence[str]) -> dict[str, QueueStats]:
        """Depth by state, latency (s) and pause flag of each queue, one round trip."""
        calls = []
        for queue in queues:
            k = self.keys(queue)
            calls.append(("stats", (k.pending, k.lease, k.scheduled, k.retry, k.dead,
                                    k.completed, k.cancelled, k.paused),
                          argv("stats", top=TOP_FAIRNESS_KEYS)))
        stats = {}
        for queue, reply in zip(queues, await self._scripts(calls)):
            r = REPLIES["stats"].head_of(reply)
            stats[queue] = QueueStats({**{state: getattr(r, state) for state in TASK_STATES},
                                       "aggregating": r.aggregating},
                                      max(r.now - r.oldest_due, 0) / 1000
                                      if r.oldest_due >= 0 else 0.0, bool(r.paused),
                                      r.fair_keys, tuple(
                                          (as_text(key), as_count(waiting)) for key, waiting
                                          in REPLIES["stats"].rows_of("fair_top", r.fair_top)))
        return stats

    async def unfinished(self, queues: Sequence[str], worker_id: str) -> int:
        """Tasks of `queues` a worker could take now and the attempts `worker_id` holds
        (unfinished.lua), each queue read at one moment."""
        calls: list[ScriptCall] = [
            ("unfinished", (self.keys(q).pending, self.keys(q).paused, self.keys(q).active),
             argv("unfinished", worker=worker_id)) for q in queues]
        return sum(await self._scripts(calls))

    async def memory_usage(self) -> tuple[int, int] | None:
        """Redis's used memory and its maxmemory (0: no limit) in bytes, from INFO memory;
        of a Cluster, the node fullest against its limit (enqueues are refused per node).
        None when the Redis user may not run INFO."""
        try:
            info = await self._within("memory_usage", self.redis.info("memory"))
        except ResponseError:  # INFO denied to the user: nothing to report, no failure
            return None
        except (RedisError, OSError) as exc:
            raise self.failed("memory_usage", exc) from exc
        nodes = [info] if "used_memory" in info else list(info.values())
        usage = [(int(n["used_memory"]), int(n.get("maxmemory", 0))) for n in nodes]
        return max(usage, key=lambda u: (u[0] / u[1] if u[1] else 0.0, u[0]))

    async def delete_namespace(self) -> int:
        """Delete every key of this namespace; returns how many there were."""
        keys = [key async for key in self.redis.scan_iter(match=f"{self.namespace}:*",
                                                          count=1000)]
        for start in range(0, len(keys), 500):  # one key per command: a Cluster's slots differ
            pipe = self.redis.pipeline(transaction=False)
            for key in keys[start:start + 500]:
                pipe.unlink(key)
            await self._guard("delete_namespace", pipe.execute())
        return len(keys)

    async def set_paused(self, queue: str, paused: bool) -> None:
        k = self.keys(queue)
        await self._script("pause", (k.paused, k.pending, k.wake),
                           argv("pause", paused=1 if paused else 0))
