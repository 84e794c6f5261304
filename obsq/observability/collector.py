"""The queue-wide gauges, read from Redis when Prometheus scrapes.

`obsq_queue_depth`, `obsq_queue_latency_seconds`, `obsq_queue_paused`,
`obsq_queue_partitions`, `obsq_queue_fairness_keys`, `obsq_queue_fairness_key_waiting` (the
ten fairness keys with most waiting tasks of each queue: bounded, not a series per tenant),
`obsq_workers`, `obsq_redis_maxmemory_policy_ok` and
`obsq_redis_memory_*_bytes` describe Redis, not this
process, so they are not multiprocess files: a custom collector asks Redis at scrape time
through an asyncio Broker that runs on some event loop (the worker's), while the scrape runs
in an HTTP thread. A partitioned queue is one queue here, its figures summed over its
partitions (obsq/inspection/partition_view.py), so dashboards and alerts read it by its own name.
Reads are cached for a second and bounded by a timeout, so a slow Redis never hangs a
scrape; concurrent scrapes share one read, and after a failure Redis is not asked again
until the cache would have expired. A failed read serves the last values while they are
recent, else nothing; `obsq_queue_gauges_read_ok` and the time of the last read that worked
are served whatever happened, so that gauges gone missing say why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily

from obsq.broker import DEPTH_STATES, Broker, QueueStats
from obsq.engine.liveness import BLOCKED_AT_LEAST
from obsq.errors import BrokerError
from obsq.inspection.partition_view import partitions_of, summed
from obsq.names import queue_of
from obsq.settings import (
    COLLECTOR_CACHE,
    COLLECTOR_STALE_LIMIT,
    COLLECTOR_TIMEOUT,
    SAFE_MEMORY_POLICY,
    TOP_FAIRNESS_KEYS,
)

log = logging.getLogger("obsq")


QueueSource = Sequence[str] | Callable[[], Awaitable[Sequence[str]]]


class QueueCollector:
    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop,
                 queues: QueueSource, *, cache_seconds: float = COLLECTOR_CACHE,
                 timeout: float = COLLECTOR_TIMEOUT,
                 loop_lag: Callable[[], float] | None = None) -> None:
        """`queues`: the names to report, or an async function returning them (the exporter
        reports every queue Redis knows). `loop_lag`: how long `loop` has been blocked now
        (any thread), so that a read it did not run is not blamed on Redis."""
        self.broker = broker
        self.loop_lag = loop_lag
        self.loop = loop
        self.queues = queues
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self._lock = threading.Lock()
        self._families: list[GaugeMetricFamily] = []
        self._read_at = 0.0  # monotonic time of the last successful read
        self._tried_at = -cache_seconds  # of the last attempt, successful or not
        self._failing = False
        self._read_wall_time = 0.0  # unix time of the last successful read (0: none yet)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        """Names only, without asking Redis (for registries that check duplicates)."""
        return [*_families({}, {}, None, None, None), *_read_status(False, 0.0)]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            now = time.monotonic()
            if now - self._tried_at >= self.cache_seconds:
                self._refresh()
                now = self._tried_at = time.monotonic()  # a slow failure counts from its end
            status = _read_status(self._read_wall_time > 0 and not self._failing,
                                  self._read_wall_time)
            if now - self._read_at > COLLECTOR_STALE_LIMIT:
                return status
            return [*self._families, *status]

    def _refresh(self) -> None:
        try:
            in_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            in_loop = False
        if in_loop or self.loop.is_closed():
            return  # waiting here would block the loop that must answer; serve the cache
        future = asyncio.run_coroutine_threadsafe(self._read(), self.loop)
        try:
            stats, counts, workers, policy, memory = future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._failed(self._why_late())
            return
        except BrokerError as exc:  # already counted by the broker's error hooks
            self._failed(str(exc))
            return
        except Exception as exc:  # a closed loop, a cancelled read: not worth a traceback
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        self._families = _families(stats, counts, workers, policy, memory)
        self._read_at = time.monotonic()
        self._read_wall_time = time.time()
        if self._failing:
            log.info("queue metrics: Redis answers again")
        self._failing = False

    def _why_late(self) -> str:
        lag = self.loop_lag() if self.loop_lag is not None else 0.0
        if lag >= BLOCKED_AT_LEAST:
            return (f"the read did not finish within {self.timeout:g} s because the event "
                    f"loop that runs it has been blocked for {lag:.1f} s (a handler holds it); "
                    "Redis was not the cause")
        return (f"the read did not finish within {self.timeout:g} s: Redis did not answer, "
                "or the event loop that runs it was too busy")

    def _failed(self, reason: str) -> None:
        if not self._failing:
            recent = self._read_wall_time and time.monotonic() - self._read_at <= \
                COLLECTOR_STALE_LIMIT
            log.warning("queue metrics: %s; %s", reason, "serving the last values" if recent
                        else "serving none until a read works")
        self._failing = True

    async def _read(self) -> tuple[dict[str, QueueStats], dict[str, int], int, str | None,
                                   tuple[int, int] | None]:
        """Each queue's figures, a partitioned queue's summed over its partitions under
        its own name (whether `queues` names it or its partitions)."""
        queues = self.queues if isinstance(self.queues, Sequence) else await self.queues()
        stored = partitions_of(await self.broker.queues())
        wanted = {q: stored.get(q, [q]) for q in dict.fromkeys(map(queue_of, queues))}
        stats = await self.broker.queue_stats([p for parts in wanted.values() for p in parts])
        counts = await self.broker.partition_counts(list(wanted)) if wanted else {}
        workers = await self.broker.workers()
        policy = await self.broker.memory_policy()
        return ({q: summed([stats[p] for p in parts]) for q, parts in wanted.items()}, counts,
                len(workers), policy, await self.broker.memory_usage())


def _read_status(ok: bool, read_at: float) -> list[GaugeMetricFamily]:
    return [GaugeMetricFamily("obsq_queue_gauges_read_ok", "1 when the last read of the "
                              "queue-wide gauges from Redis worked, 0 when it failed (they are "
                              "then served from the last read, and left out after "
                              f"{COLLECTOR_STALE_LIMIT:g} s)", value=1 if ok else 0),
            GaugeMetricFamily("obsq_queue_gauges_read_timestamp_seconds", "Unix time of the "
                              "last read of the queue-wide gauges from Redis that worked "
                              "(0: none yet)", value=read_at)]


def _families(stats: dict[str, QueueStats], counts: dict[str, int], workers: int | None,
              policy: str | None, memory: tuple[int, int] | None) -> list[GaugeMetricFamily]:
    depth = GaugeMetricFamily("obsq_queue_depth", "Tasks of a queue in each state",
                              labels=["queue", "state"])
    latency = GaugeMetricFamily("obsq_queue_latency_seconds",
                                "Age of the oldest pending task of a queue", labels=["queue"])
    paused = GaugeMetricFamily("obsq_queue_paused", "1 when the queue is paused",
                               labels=["queue"])
    partitions = GaugeMetricFamily("obsq_queue_partitions", "Partitions a queue is stored "
                                   "as, as its workers declare them (app.queue)",
                                   labels=["queue"])
    keys = GaugeMetricFamily("obsq_queue_fairness_keys", "Fairness keys with waiting tasks "
                             "in a queue", labels=["queue"])
    key_waiting = GaugeMetricFamily(
        "obsq_queue_fairness_key_waiting", f"Waiting tasks of the {TOP_FAIRNESS_KEYS} "
        "fairness keys of a queue with most (the others are not named)",
        labels=["queue", "key"])
    live = GaugeMetricFamily("obsq_workers", "Live workers registered in Redis")
    policy_ok = GaugeMetricFamily(
        "obsq_redis_maxmemory_policy_ok",
        f"1 when Redis's maxmemory-policy is {SAFE_MEMORY_POLICY}, 0 when it may evict task "
        "data (absent when Redis denies reading it)")
    used = GaugeMetricFamily("obsq_redis_memory_used_bytes", "Memory Redis uses (INFO memory "
                             "used_memory; of a Cluster, its node fullest against its limit)")
    limit = GaugeMetricFamily("obsq_redis_memory_max_bytes", "Redis's maxmemory (0: no limit); "
                              "enqueues are refused above the producers' share of it")
    for queue, s in stats.items():
        for state in DEPTH_STATES:
            depth.add_metric([queue, state], s.depth[state])
        latency.add_metric([queue], s.latency)
        paused.add_metric([queue], 1 if s.paused else 0)
        keys.add_metric([queue], s.keys_waiting)
        for key, waiting in s.top_keys:
            key_waiting.add_metric([queue, key], waiting)
    for queue, count in counts.items():
        partitions.add_metric([queue], count)
    if workers is not None:
        live.add_metric([], workers)
    if policy is not None:
        policy_ok.add_metric([], 1 if policy == SAFE_MEMORY_POLICY else 0)
    if memory is not None:
        used.add_metric([], memory[0])
        limit.add_metric([], memory[1])
    return [depth, latency, paused, partitions, keys, key_waiting, live, policy_ok, used, limit]
