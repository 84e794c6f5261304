"""A queue of several partitions (app.queue(name, partitions=N)) on one Redis: each task
lands in one partition, chosen so that what must stay together does (an ordering key, a
unique key, a group, a producer-chosen id); producers without the App learn the count the
workers wrote; the worker serves every partition, an idle one woken by any of them; the
partitions of an earlier count are drained; route limits are shared out per partition;
reading, cancelling and deleting by the queue's name find the task where it is."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

import obsq
import obsq.task
from obsq.broker import QueueKeys
from obsq.engine import fetching
from obsq.names import partition_names, queue_of
from obsq.producer import enqueue as coalescing

HOT = partition_names("hot", 3)


def _declared(app: obsq.App, count: int = 3) -> obsq.App:
    app.queue("hot", partitions=count)
    return app


async def test_tasks_spread_and_run_and_read_back_by_the_queues_name(app, client,
                                                                    start_worker) -> None:
    _declared(app)

    @app.task("echo", queue="hot")
    async def echo(task: obsq.Task):
        return [task.queue, task.partition]

    infos = await client.enqueue_many([obsq.Job("echo", i, retention=60) for i in range(90)])
    counts = {name: sum(i.partition == name for i in infos) for name in HOT}
    assert all(15 <= n <= 45 for n in counts.values()), counts
    assert {i.queue for i in infos} == {"hot"}
    waiting = await client.info(infos[0].id, "hot")
    assert (waiting.queue, waiting.partition, waiting.state) == ("hot", infos[0].partition,
                                                                  "pending")
    await start_worker(queues="hot")
    assert await client.result(infos[0], timeout=10) == ["hot", infos[0].partition]
    assert await client.result(infos[1].id, timeout=10, queue="hot") == [
        "hot", infos[1].partition]
    assert (await client.info(infos[2].id)).partition == infos[2].partition


async def test_what_must_stay_together_lands_in_one_partition(app, client) -> None:
    _declared(app)
    keyed = await client.enqueue_many([obsq.Job("t", i, queue="hot", ordering_key="k1")
                                       for i in range(20)])
    assert len({i.partition for i in keyed}) == 1
    first = await client.enqueue("t", {"same": 1}, queue="hot", unique_for=60)
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("t", {"same": 1}, queue="hot", unique_for=60)
    again = await client.enqueue_many([obsq.Job("t", {"same": 1}, queue="hot",
                                                 unique_for=60)])
    assert again[0].duplicate and again[0].id == first.id
    await client.enqueue("t", 1, queue="hot", task_id="order-77")
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("t", 2, queue="hot", task_id="order-77")


async def test_a_producer_without_the_app_learns_the_count(app, redis_url, namespace,
                                                           raw_redis, start_worker) -> None:
    _declared(app)
    await start_worker(queues="hot")
    assert raw_redis.hget(f"{namespace}:partitions", "hot") == b"3"
    async with obsq.Client(redis_url, namespace=namespace) as bare:
        infos = await bare.enqueue_many([obsq.Job("x", i, queue="hot") for i in range(30)])
    assert {i.partition for i in infos} == set(HOT)
    with obsq.SyncClient(redis_url, namespace=namespace) as sync:
        assert sync.enqueue("x", 1, queue="hot").partition in HOT
    cold = obsq.App(namespace)
    cold.queue("cold", partitions=4)  # no worker has written its count
    async with obsq.Client(redis_url, app=cold) as producer, obsq.Client(
            redis_url, namespace=namespace) as bare:
        early = await producer.enqueue("x", 1, queue="cold")
        assert early.partition and (await bare.info(early.id, "cold")).partition == (
            early.partition)
        raw_redis.hset(f"{namespace}:partitions", "junk", "not a count")
    async with obsq.Client(redis_url, namespace=namespace) as bare:
        assert (await bare.enqueue("x", 1, queue="junk")).partition == ""  # one partition


async def test_an_idle_worker_wakes_for_a_task_in_any_partition(app, client,
                                                                start_worker) -> None:
    _declared(app)
    done = asyncio.Queue()

    @app.task("ping", queue="hot")
    async def ping(task: obsq.Task):
        done.put_nowait(task.partition)

    await start_worker(queues="hot", wait_timeout=30.0)
    for name in (*HOT, *reversed(HOT)):
        await asyncio.sleep(0.2)  # the worker is back in its wait
        await client.enqueue("ping", queue=name)  # straight into one partition
        assert await asyncio.wait_for(done.get(), timeout=5) == name


async def test_the_partitions_of_an_earlier_count_are_drained(app, redis_url, namespace,
                                                              start_worker, monkeypatch
                                                              ) -> None:
    monkeypatch.setattr(fetching, "REFRESH", 0.2)
    ran: list[str] = []
    old = obsq.App(namespace)
    old.queue("hot", partitions=2)

    @app.task("job", queue="hot")
    async def job(task: obsq.Task):
        ran.append(task.partition)

    async with obsq.Client(redis_url, app=old) as producer:
        before = await producer.enqueue_many([obsq.Job("job", i, queue="hot")
                                              for i in range(20)])
        assert {i.partition for i in before} == set(partition_names("hot", 2))
        await start_worker(_declared(app), queues="hot")
        await wait_until(lambda: len(ran) == 20, what="the old partitions drained")
        # an old producer still writing there, after the worker looked
        await asyncio.sleep(0.5)
        await producer.enqueue_many([obsq.Job("job", i, queue="hot") for i in range(5)])
        await wait_until(lambda: len(ran) == 25, what="the late tasks served")
    async with obsq.Client(redis_url, app=app) as producer:
        await producer.enqueue_many([obsq.Job("job", i, queue="hot") for i in range(30)])
    await wait_until(lambda: len(ran) == 55)
    assert set(ran[25:]) == set(HOT)


async def test_a_routes_concurrency_limit_is_shared_out(app, client, start_worker) -> None:
    _declared(app)
    running, most = 0, 0

    @app.task("slow", queue="hot", concurrency=4)
    async def slow(task: obsq.Task):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1

    infos = await client.enqueue_many([obsq.Job("slow", i, retention=60) for i in range(60)])
    await start_worker(queues="hot", concurrency=30)
    for info in infos:
        await client.result(info, timeout=30)
    assert 3 <= most <= 4 + 3 - 1  # ceil(4/3) = 2 per partition: at most 6 at once


async def test_cancel_delete_flows_and_groups_in_a_partitioned_queue(app, client,
                                                                    start_worker) -> None:
    _declared(app)

    @app.task("add", queue="hot")
    async def add(task: obsq.Task):
        return (task.previous or 0) + task.payload

    batches: list[list[int]] = []

    @app.task("batch", queue="hot")
    async def batch(task: obsq.Task):
        batches.append(sorted(task.payload))

    app.aggregate("item", lambda group, tasks: ("batch", [t.payload for t in tasks]),
                  max_size=5)
    waiting = [await client.enqueue("add", i, queue="hot", delay=60) for i in range(6)]
    assert {await client.cancel(w.id, "hot") for w in waiting[:3]} == {"cancelled"}
    assert {await client.delete(w.id, "hot") for w in waiting[3:]} == {"scheduled"}
    grouped = [await client.enqueue("item", i, queue="hot", group="g") for i in range(5)]
    assert len({g.partition for g in grouped}) == 1
    await start_worker(queues="hot")
    flow = await client.enqueue(obsq.chain(*(obsq.Job("add", n) for n in range(1, 6))))
    assert await client.result(flow, timeout=20) == 15
    assert {queue_of(s.queue) for s in (await client.info(flow)).steps} == {"hot"}
    await wait_until(lambda: batches == [[0, 1, 2, 3, 4]], what="the group aggregated")


def test_names_and_counts_are_checked() -> None:
    app = obsq.App()
    for bad in (0, 257, "3", 2.0, True):
        with pytest.raises(ValueError, match="partitions"):
            app.queue("hot", partitions=bad)
    with pytest.raises(ValueError, match="'#'"):
        app.queue("a#b", partitions=2)
    with pytest.raises(ValueError, match="'#'"):
        app.task("t", queue="a#1")
    with pytest.raises(ValueError, match="'#'"):
        obsq.task.build_message(obsq.Job("t", queue="hot#x"))
    assert obsq.task.build_message(obsq.Job("t", queue=HOT[2])).queue == HOT[2]  # one
    assert queue_of(HOT[1]) == "hot" and len(set(HOT)) == 3


async def test_a_redis_restarted_empty_learns_the_counts_again(app, redis_url, namespace,
                                                               raw_redis, start_worker
                                                               ) -> None:
    _declared(app)
    ran: list[str] = []

    @app.task("job", queue="hot")
    async def job(task: obsq.Task):
        ran.append(task.partition)

    await start_worker(queues="hot")
    for key in raw_redis.scan_iter(match=f"{namespace}:*"):  # what a restart loses
        raw_redis.delete(key)
    await wait_until(lambda: raw_redis.hget(f"{namespace}:partitions", "hot") == b"3",
                     what="the count written again by the next heartbeat")
    async with obsq.Client(redis_url, namespace=namespace) as bare:
        await bare.enqueue_many([obsq.Job("job", i, queue="hot") for i in range(30)])
    await wait_until(lambda: len(ran) == 30)
    assert set(ran) == set(HOT)


async def test_a_rolling_deploy_that_partitions_a_queue(app, redis_url, namespace,
                                                        start_worker, monkeypatch) -> None:
    """The old version (one partition) and the new (three) run side by side, producers of
    both write; every task runs once, and the old workers leave nothing behind."""
    monkeypatch.setattr(fetching, "REFRESH", 0.2)
    ran: list[int] = []
    old = obsq.App(namespace)
    for version in (old, _declared(app)):
        version.task("job", queue="hot")(lambda task: ran.append(task.payload))
    old_worker = await start_worker(old, queues="hot")
    await start_worker(app, queues="hot")
    async with obsq.Client(redis_url, app=old) as old_producer, obsq.Client(
            redis_url, app=app) as new_producer:
        for n in range(0, 200, 20):
            await old_producer.enqueue_many([obsq.Job("job", n + i) for i in range(10)])
            await new_producer.enqueue_many([obsq.Job("job", n + i) for i in range(10, 20)])
            if n == 100:
                old_worker.stop()
        await wait_until(lambda: len(ran) >= 200, timeout=30)
        await asyncio.sleep(0.3)
    assert sorted(ran) == list(range(200))


async def test_priorities_hold_across_the_partitions(app, client, inspector, start_worker,
                                                     monkeypatch) -> None:
    """The worker takes a queue's partitions in the order of their best tasks (each fetch
    tells it the rank of the best task left), so the queue's higher priorities run first
    whichever partition holds them. (Each partition is also looked at once a second
    whatever its rank, which a loaded host could reach within the run: not here.)"""
    monkeypatch.setattr(fetching, "AHEAD_FOR", 600.0)
    _declared(app)
    ran: list[int] = []

    @app.task("p", queue="hot")
    async def p(task: obsq.Task):
        ran.append(task.payload)

    infos = await client.enqueue_many([obsq.Job("p", 0) for _ in range(30)]
                                      + [obsq.Job("p", 9, priority=9) for _ in range(30)])
    assert len({i.partition for i in infos[30:]}) == 3
    await inspector.pause("hot")
    await start_worker(queues="hot", concurrency=1)
    await inspector.unpause("hot")
    await wait_until(lambda: len(ran) == 60)
    assert ran == [9] * 30 + [0] * 30, ran


async def test_a_partition_s_fetch_stops_at_the_rank_floor(client, broker, raw_redis,
                                                          namespace) -> None:
    """dequeue.lua takes no task ranked after the floor (the best task another partition
    holds): it tells the rank of the best left instead, and an idle worker's wake tokens
    stay, as tasks do."""
    await client.enqueue_many([obsq.Job("p", i, queue=HOT[0], priority=9) for i in range(3)]
                              + [obsq.Job("p", 10 + i, queue=HOT[0]) for i in range(3)])
    seconds, micros = raw_redis.time()
    now_ms = seconds * 1000 + micros // 1000
    aging_ms = int(broker.priority_aging * 1000)
    wake = QueueKeys(namespace, HOT[0]).wake
    tokens = raw_redis.llen(wake)
    assert tokens

    _, none = await broker.dequeue(HOT[0], 10, "w", 30, floor=now_ms - 100 * aging_ms)
    assert none.tasks == [] and none.ahead_ms is not None  # all of them rank after it
    assert raw_redis.llen(wake) == tokens
    _, high = await broker.dequeue(HOT[0], 10, "w", 30, floor=now_ms - aging_ms)
    assert [t.priority for t in high.tasks] == [9, 9, 9]
    assert now_ms - 5_000 <= high.ahead_ms <= now_ms  # the 0s' rank: when they were due
    _, low = await broker.dequeue(HOT[0], 10, "w", 30)
    assert [t.priority for t in low.tasks] == [0, 0, 0]


async def test_partitions_lost_with_redis_are_registered_again_by_their_producer(
        app, redis_url, namespace, raw_redis, start_worker, monkeypatch) -> None:
    """A worker of another count finds a producer's partitions through the namespace's set
    of queues; after Redis lost its data the producer puts them back there."""
    monkeypatch.setattr(fetching, "REFRESH", 0.2)
    monkeypatch.setattr(coalescing, "REGISTER_AGAIN", 0.2)
    ran: list[int] = []

    @app.task("job", queue="hot")
    async def job(task: obsq.Task):
        ran.append(task.payload)

    await start_worker(_declared(app, 2), queues="hot")
    other = obsq.App(namespace)
    other.queue("hot", partitions=4)
    async with obsq.Client(redis_url, app=other) as producer:
        await producer.enqueue_many([obsq.Job("job", n, queue="hot") for n in range(20)])
        await wait_until(lambda: len(ran) == 20)
        for key in raw_redis.scan_iter(match=f"{namespace}:*"):  # what a restart loses
            raw_redis.delete(key)
        await asyncio.sleep(0.3)
        await producer.enqueue_many([obsq.Job("job", n, queue="hot") for n in range(20, 40)])
        await wait_until(lambda: len(ran) == 40, what="the second batch run")
    assert sorted(ran) == list(range(40))


def test_only_the_names_obsq_gives_partitions_address_one() -> None:
    """A partition's name typed with another index, count or salt would make a partition
    that no worker serves: refused, as any '#' in a queue's name."""
    for typo in ("hot#7/3.0", HOT[1].rsplit(".", 1)[0] + ".999", "hot#1/8.0", "hot#0/1.0"):
        with pytest.raises(ValueError, match="'#'"):
            obsq.task.build_message(obsq.Job("t", queue=typo))
