"""Task groups across worker processes: every grouped task lands in exactly one aggregated
task, with three workers running the aggregator loop, and when workers are SIGKILLed in
the middle of aggregating (tests/engine/fanout_apps.py is their App)."""

from __future__ import annotations

import asyncio
import collections
import signal

import orjson
from support import depth, wait_until

import obsq

from .helpers import record_key

APP = "tests.engine.fanout_apps:app"
GROUPS = [f"g{n}" for n in range(7)]


async def enqueue_rows(client: obsq.Client, count: int) -> set[str]:
    infos = await asyncio.gather(*(client.enqueue("ingest:row", {"n": n},
                                                  group=GROUPS[n % len(GROUPS)])
                                   for n in range(count)))
    return {info.id for info in infos}


def batches(raw_redis, namespace: str) -> dict[str, dict]:
    """Aggregated tasks that ran, by id (a task run twice after a crash counts once)."""
    runs = [orjson.loads(r) for r in raw_redis.lrange(record_key(namespace, "batches"), 0, -1)]
    by_id: dict[str, dict] = {}
    for run in runs:
        assert by_id.setdefault(run["id"], run) == run  # every run of a task: the same ids
    return by_id


def assert_each_task_in_one_batch(found: dict[str, dict], ids: set[str]) -> None:
    counts = collections.Counter(i for batch in found.values() for i in batch["ids"])
    assert set(counts) == ids
    assert set(counts.values()) == {1}
    assert all(1 <= len(b["ids"]) <= 10 for b in found.values())


async def test_grouped_tasks_aggregate_once_across_workers(spawn_worker, broker, redis_url,
                                                           namespace, raw_redis) -> None:
    workers = [spawn_worker(app=APP) for _ in range(3)]
    await wait_until(lambda: len(raw_redis.keys(f"{namespace}:worker:*")) == 3, timeout=30)
    async with obsq.Client(redis_url, namespace=namespace) as client:
        ids = await enqueue_rows(client, 400)
        await wait_until(lambda: sum(len(b["ids"]) for b in batches(raw_redis, namespace).values())
                         >= 400, timeout=60, what="every grouped task aggregated")
    found = batches(raw_redis, namespace)
    assert_each_task_in_one_batch(found, ids)
    by_group = collections.Counter(b["group"] for b in found.values())
    assert set(by_group) == set(GROUPS)
    assert (await depth(broker))["aggregating"] == 0
    await wait_until(lambda: not raw_redis.zcard(f"{namespace}:{{default}}:batches"),
                     what="every batch ended (a batch's task may run before it ends)")
    assert all(w.poll() is None for w in workers)


async def test_sigkill_mid_aggregation_loses_and_doubles_nothing(
        spawn_worker, broker, redis_url, namespace, raw_redis) -> None:
    slow = {"OBSQ_ENGINE_AGGREGATE_SLEEP": "0.4", "OBSQ_AGGREGATE_LEASE": "2"}
    workers = [spawn_worker(app=APP, **slow) for _ in range(3)]
    await wait_until(lambda: len(raw_redis.keys(f"{namespace}:worker:*")) == 3, timeout=30)
    aggregated = record_key(namespace, "aggregated")
    async with obsq.Client(redis_url, namespace=namespace) as client:
        ids = await enqueue_rows(client, 300)
        await wait_until(lambda: raw_redis.llen(aggregated) >= 3, timeout=30)
        for worker in workers[:2]:  # in the middle of their aggregators' runs
            worker.signal(signal.SIGKILL)
        workers += [spawn_worker(app=APP, **slow) for _ in range(2)]
        await wait_until(lambda: sum(len(b["ids"]) for b in batches(raw_redis, namespace).values())
                         >= 300, timeout=90, what="every grouped task aggregated")
    found = batches(raw_redis, namespace)
    assert_each_task_in_one_batch(found, ids)
    assert (await depth(broker))["aggregating"] == 0
    await wait_until(lambda: not raw_redis.zcard(f"{namespace}:{{default}}:batches"),
                     what="no batch left claimed")
    runs = raw_redis.llen(aggregated)
    print(f"{len(found)} batches, {runs} aggregator runs")  # runs > batches: claimed again
