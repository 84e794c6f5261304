"""Task groups across worker processes: every grouped task lands in exactly one aggregated
task, with three workers running the aggregator loop, and when workers are SIGKILLed in
the middle of aggregating (tests/engine/fanout_apps.py is their App). A group's window, its
grace period after the newest task and its longest delay after the oldest, is checked on a
clock the test steps."""

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
    await wait_until(lambda: not raw_redis.zcard(f"{namespace}:{{default}}:batches"),
                     what="every batch ended (a batch's task may run before it ends)")
    assert (await depth(broker))["aggregating"] == 0  # a batch's tasks count until it ends
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
    await wait_until(lambda: not raw_redis.zcard(f"{namespace}:{{default}}:batches"),
                     what="no batch left claimed")
    assert (await depth(broker))["aggregating"] == 0
    runs = raw_redis.llen(aggregated)
    print(f"{len(found)} batches, {runs} aggregator runs")  # runs > batches: claimed again


async def test_sigterm_hands_claimed_batches_to_another_worker_at_once(
        spawn_worker, broker, redis_url, namespace, raw_redis) -> None:
    """A's aggregator blocks; on SIGTERM, A releases its claim and B aggregates the batch
    before A's claim (60 s) would have run out."""
    lease = {"OBSQ_AGGREGATE_LEASE": "60"}
    first = spawn_worker(app=APP, OBSQ_ENGINE_AGGREGATE_SLEEP="3600", **lease)
    await wait_until(lambda: len(raw_redis.keys(f"{namespace}:worker:*")) == 1, timeout=30)
    aggregated = record_key(namespace, "aggregated")
    batches_key = f"{namespace}:{{default}}:batches"
    async with obsq.Client(redis_url, namespace=namespace) as client:
        ids = {(await client.enqueue("ingest:row", {"n": n}, group="g")).id for n in range(10)}
    await wait_until(lambda: raw_redis.llen(aggregated) == 1, timeout=30,
                     what="A's aggregator under way")
    [(batch_id, claim_end)] = raw_redis.zrange(batches_key, 0, -1, withscores=True)
    held_by = raw_redis.hget(f"{namespace}:{{default}}:batch:{batch_id.decode()}", "owner")
    second = spawn_worker(app=APP, **lease)
    await wait_until(lambda: len(raw_redis.keys(f"{namespace}:worker:*")) == 2, timeout=30)
    assert batches(raw_redis, namespace) == {}  # B leaves A's claim alone

    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    await wait_until(lambda: batches(raw_redis, namespace), timeout=45,
                     what="B aggregated the batch A released")
    [(seconds, micros)] = [raw_redis.time()]
    assert seconds * 1000 + micros // 1000 < claim_end  # before A's claim would have ended
    assert held_by.decode() in first.log() and "released 1 of 1 batch claim(s)" in first.log()
    found = batches(raw_redis, namespace)
    assert list(found) == [batch_id.decode()]  # the same batch, aggregated once
    assert_each_task_in_one_batch(found, ids)
    assert raw_redis.llen(aggregated) == 2  # A's run (cancelled), then B's
    assert second.poll() is None


async def test_a_release_by_a_stale_claimant_changes_nothing(client, broker, raw_redis,
                                                             namespace) -> None:
    rules = [("ingest:row", 3, 60.0, 60.0)]
    for n in range(3):
        await client.enqueue("ingest:row", n, group="g")
    [stale] = (await broker.claim_batches("default", "worker-a", 60, rules, 5)).batches
    await broker.end_batch(stale, "RuntimeError: boom", retry_in=0)  # A's claim is over
    [current] = (await broker.claim_batches("default", "worker-b", 60, rules, 5)).batches
    assert (current.id, current.fence > stale.fence) == (stale.id, True)

    def snapshot() -> tuple:
        return (raw_redis.hgetall(f"{namespace}:{{default}}:batch:{current.id}"),
                raw_redis.zrange(f"{namespace}:{{default}}:batches", 0, -1, withscores=True))

    before = snapshot()
    assert await broker.release_batches("worker-a", [stale]) == 0  # another fence
    assert await broker.release_batches("worker-a", [current]) == 0  # another owner
    assert snapshot() == before
    assert (await broker.claim_batches("default", "worker-c", 60, rules, 5)).batches == []

    assert await broker.release_batches("worker-b", [current]) == 1  # its own claim
    [taken] = (await broker.claim_batches("default", "worker-c", 60, rules, 5)).batches
    assert (taken.id, taken.failures, len(taken.tasks)) == (current.id, 1, 3)


async def test_a_group_waits_its_grace_period_and_no_longer_than_its_longest_delay(
        app, start_env) -> None:
    made: list[tuple[str, int, float]] = []

    @app.task("visits")
    async def visits(task: obsq.Task) -> None:
        made.append((task.payload["page"], task.payload["count"], env.clock.time() - start))

    async def count(group: str, tasks: list[obsq.Task]) -> tuple[str, dict]:
        return "visits", {"page": group, "count": len(tasks)}

    app.aggregate("visit:", count, max_size=100, max_delay=30, grace_period=10)
    env = await start_env()
    start = env.clock.time()
    await env.client.enqueue("visit:page", None, group="/b")
    for moment in (0, 9, 18, 27):  # "/a": a task every 9 s, each within the last one's grace
        await env.advance(moment - (env.clock.time() - start))
        await env.client.enqueue("visit:page", None, group="/a")
    assert made == [("/b", 1, 10)]  # its one task's grace period ended at 10 s
    await env.advance(2.999)
    assert len(made) == 1  # "/a" is still in its window
    await env.advance(0.001)  # 30 s after its first task: its longest delay is over
    assert made == [("/b", 1, 10), ("/a", 4, 30)]
