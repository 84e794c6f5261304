"""Debounce, latest wins: enqueues sharing a debounce key run once, `debounce` after the last
of them (at most `debounce_max` after the first), with the last payload; the waiting task is
replaced in Redis by one script call, so concurrent producers, partitions and a worker
killed between enqueues change nothing of that."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from support import wait_until

import obsq
from obsq.broker import QueueKeys
from obsq.inspection.inspector import Inspector

from .helpers import live_worker_pids, namespace_keys, record_key


async def test_a_burst_runs_once_with_the_last_payload_after_the_last_enqueue(
        app, client, start_worker, broker) -> None:
    ran: list[tuple[str, int, float]] = []

    @app.task("index:doc")
    async def index(task: obsq.Task) -> None:
        ran.append((task.id, task.payload["n"], time.time()))

    await start_worker()
    infos = []
    for n in range(20):
        sent = time.time()
        infos.append(await client.enqueue("index:doc", {"n": n}, debounce_key="doc-42",
                                          debounce=0.5))
        await asyncio.sleep(0.05)
    await wait_until(lambda: ran, what="the burst's task runs")
    assert {i.id for i in infos} == {infos[0].id}
    assert [i.debounced for i in infos] == [False] + [True] * 19
    assert all(i.state == "scheduled" and not i.duplicate for i in infos)
    [(task_id, n, started)] = ran
    assert (task_id, n) == (infos[0].id, 19)
    assert started >= sent + 0.5 - 0.002  # Redis counts whole ms
    stats = (await broker.queue_stats(["default"]))["default"]
    assert stats.depth["scheduled"] == stats.depth["pending"] == 0  # nothing else waits
    assert len(ran) == 1


async def test_due_times_move_with_each_enqueue_and_debounce_max_bounds_them(
        app, start_env) -> None:
    ran: list[tuple[float, str, int]] = []
    env: obsq.testing.Environment

    @app.task("index:doc")
    async def index(task: obsq.Task) -> None:
        ran.append((env.clock.time() - start, task.payload["key"], task.payload["n"]))

    env = await start_env()
    start = env.clock.time()
    # a continuous stream, one enqueue every 0.5 s: debounce alone would never run it
    for n in range(20):
        await env.client.enqueue("index:doc", {"key": "a", "n": n}, debounce_key="a",
                                 debounce=1, debounce_max=3)
        if n < 4:  # another key, of its own burst, meanwhile
            await env.client.enqueue("index:doc", {"key": "b", "n": n}, debounce_key="b",
                                     debounce=2)
        await env.advance(0.5)
    await env.advance(5)
    # each burst runs 3 s after its first enqueue; the next enqueue starts a burst
    assert sorted(ran) == [(3.0, "a", 5), (3.5, "b", 3), (6.0, "a", 11), (9.0, "a", 17),
                           (10.5, "a", 19)]


async def test_a_replacing_enqueue_brings_its_expiry_and_fairness_key(
        app, start_env, broker) -> None:
    """Latest wins for every option: a burst that outlasts the first enqueue's expiry still
    runs, as the last enqueue's expiry counts; its fairness key is the last one's too."""
    ran: list[int] = []

    @app.task("index:doc")
    async def index(task: obsq.Task) -> None:
        ran.append(task.payload["n"])

    env = await start_env()
    for n in range(6):  # 2.5 s of enqueues, each expiring 2 s after it was made
        info = await env.client.enqueue("index:doc", {"n": n}, debounce_key="doc",
                                        debounce=1, expires=2, fairness_key=f"tenant-{n}")
        await env.advance(0.5)
    fields, _ = await broker.task_fields("default", info.id)
    assert fields[b"fk"] == b"tenant-5"
    await env.advance(2)  # due 1 s after the last enqueue, before its expiry
    assert ran == [5]  # run, not expired (the first enqueue's expiry was at 2 s)


async def test_keys_are_per_type_and_queue_and_bytes_replace_json(app, start_env) -> None:
    ran: list[tuple[str, str, object]] = []

    @app.task("a")
    async def a(task: obsq.Task) -> None:
        ran.append((task.type, task.queue, task.payload))

    @app.task("b")
    async def b(task: obsq.Task) -> None:
        ran.append((task.type, task.queue, task.payload))

    env = await start_env(queues={"default": 1, "other": 1})
    first = await env.client.enqueue("a", {"json": 1}, debounce_key="k", debounce=1,
                                     headers={"x": "1"}, priority=3, max_retry=2)
    await env.client.enqueue("b", "b", debounce_key="k", debounce=1)
    await env.client.enqueue("a", "other queue", debounce_key="k", debounce=1, queue="other")
    last = await env.client.enqueue("a", b"\x00raw", debounce_key="k", debounce=1)
    assert (last.id, last.debounced) == (first.id, True)
    stored = await env.client.info(first.id)
    assert (stored.payload, stored.headers, stored.priority, stored.max_retry) == (
        b"\x00raw", {}, 0, None)  # the last enqueue's payload and options, whole
    await env.advance(1)
    assert sorted(ran, key=repr) == sorted([("a", "default", b"\x00raw"), ("b", "default", "b"),
                                            ("a", "other", "other queue")], key=repr)


async def test_enqueue_many_of_one_key_makes_one_task(app, client, start_env) -> None:
    ran: list[int] = []

    @app.task("t")
    async def t(task: obsq.Task) -> None:
        ran.append(task.payload)

    env = await start_env()
    infos = await env.client.enqueue_many([obsq.Job("t", n, debounce_key="k", debounce=1)
                                           for n in range(5)])
    assert {i.id for i in infos} == {infos[0].id}
    assert [i.debounced for i in infos] == [False, True, True, True, True]
    await env.advance(1)
    assert ran == [4]


async def test_concurrent_producers_still_run_it_once(app, redis_url, namespace, start_worker,
                                                      client) -> None:
    ran: list[tuple[str, object]] = []

    @app.task("t")
    async def t(task: obsq.Task) -> None:
        ran.append((task.id, task.payload))

    await start_worker()
    clients = [obsq.Client(redis_url, namespace=namespace, app=app) for _ in range(3)]
    sync_infos: list[obsq.TaskInfo] = []

    def sync_producer() -> None:
        with obsq.SyncClient(redis_url, namespace=namespace, app=app) as sync:
            for n in range(30):
                sync_infos.append(sync.enqueue("t", f"sync {n}", debounce_key="k", debounce=1))

    thread = threading.Thread(target=sync_producer)
    thread.start()
    infos = await asyncio.gather(*(c.enqueue("t", f"{i} {n}", debounce_key="k", debounce=1)
                                   for n in range(30) for i, c in enumerate(clients)))
    await asyncio.to_thread(thread.join)
    everyone = [*infos, *sync_infos]
    assert len({i.id for i in everyone}) == 1
    assert sum(not i.debounced for i in everyone) == 1  # one created it, the rest replaced
    await wait_until(lambda: ran, what="the task runs")
    stats = (await clients[0].broker.queue_stats(["default"]))["default"]
    assert stats.depth["scheduled"] == stats.depth["pending"] == 0 and len(ran) == 1
    for c in clients:
        await c.close()


async def test_a_partitioned_queue_keeps_each_key_in_one_partition(
        app, client_without_app, start_worker, broker) -> None:
    app.queue("events", partitions=4)
    ran: list[tuple[str, str, int]] = []

    @app.task("t", queue="events")
    async def t(task: obsq.Task) -> None:
        ran.append((task.payload["key"], task.partition, task.payload["n"]))

    await start_worker()
    # a producer without the App reads the partition count the worker wrote
    infos = [await client_without_app.enqueue("t", {"key": f"k{k}", "n": n}, queue="events",
                                              debounce_key=f"k{k}", debounce=0.5)
             for n in range(5) for k in range(8)]
    for k in range(8):
        mine = infos[k::8]
        assert len({(i.id, i.partition) for i in mine}) == 1
    assert len({i.partition for i in infos}) > 1  # the keys spread over the partitions
    await wait_until(lambda: len(ran) == 8, what="one run per key")
    assert sorted((key, n) for key, _, n in ran) == [(f"k{k}", 4) for k in range(8)]
    assert {(key, partition) for key, partition, _ in ran} == {
        (f"k{k}", infos[k].partition) for k in range(8)}


async def test_an_enqueue_after_the_task_started_starts_a_new_burst(
        app, client, start_worker) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @app.task("t")
    async def t(task: obsq.Task) -> None:
        ran.append(task.payload)
        started.set()
        await release.wait()

    await start_worker()
    first = await client.enqueue("t", "first", debounce_key="k", debounce=0.2)
    await asyncio.wait_for(started.wait(), 10)
    second = await client.enqueue("t", "second", debounce_key="k", debounce=0.2)
    assert second.id != first.id and not second.debounced
    release.set()
    await wait_until(lambda: ran == ["first", "second"], what="both bursts run")


async def test_a_worker_killed_between_enqueues_loses_nothing(
        client_without_app, spawn_worker, broker, raw_redis, namespace) -> None:
    worker = spawn_worker()
    await wait_until(lambda: live_worker_pids(broker), timeout=20, what="the worker starts")
    infos = [await client_without_app.enqueue("debounced", {"n": n}, debounce_key="doc",
                                              debounce=2) for n in range(3)]
    worker.signal(signal.SIGKILL)
    worker.wait()
    infos += [await client_without_app.enqueue("debounced", {"n": n}, debounce_key="doc",
                                               debounce=2) for n in range(3, 6)]
    spawn_worker()
    span = record_key(namespace, "span")
    await wait_until(lambda: raw_redis.llen(span), timeout=20, what="the task runs")
    assert {i.id for i in infos} == {infos[0].id}
    stats = (await broker.queue_stats(["default"]))["default"]
    assert stats.depth["scheduled"] == stats.depth["pending"] == 0
    [entry] = raw_redis.lrange(span, 0, -1)
    assert entry.decode().split(maxsplit=3)[2:] == [infos[0].id, '{"n":5}']


@pytest.mark.parametrize(("options", "error"), [
    ({"debounce": 1}, "need a debounce_key"),
    ({"debounce_max": 1}, "need a debounce_key"),
    ({"debounce_key": "k"}, "needs debounce="),
    ({"debounce_key": "k", "debounce": -1}, "debounce must be a positive number"),
    ({"debounce_key": "k", "debounce": 0}, "debounce must be a positive number"),
    ({"debounce_key": "k", "debounce": 2, "debounce_max": 1}, "must be at least debounce"),
    ({"debounce_key": "a b", "debounce": 1}, "must not contain spaces"),
    ({"debounce_key": "k", "debounce": 1, "delay": 5}, "takes no delay"),
    ({"debounce_key": "k", "debounce": 1, "unique_for": 5, "task_id": "x"},
     "takes no unique_for, task_id"),
    ({"debounce_key": "k", "debounce": 1, "ordering_key": "o"}, "takes no ordering_key"),
    ({"debounce_key": "k", "debounce": 1, "group": "g"}, "grouped task takes no"),
])
async def test_bad_options_are_refused_before_anything_is_written(
        app, client, redis_url, namespace, raw_redis, options, error) -> None:
    @app.task("t")
    async def t(task: obsq.Task) -> None:
        pass

    with pytest.raises(ValueError, match=error):
        await client.enqueue("t", 1, **options)
    if "group" not in options:
        with pytest.raises(ValueError, match=error):
            await client.enqueue_many([obsq.Job("t", 1, **options)])
        with obsq.SyncClient(redis_url, namespace=namespace, app=app) as sync, \
                pytest.raises(ValueError, match=error):
            sync.enqueue("t", 1, **options)
    assert namespace_keys(raw_redis, namespace) == []


async def test_a_debounced_route_needs_a_key_and_lends_its_times(
        app, client, namespace, raw_redis) -> None:
    @app.task("index:", debounce=2, debounce_max=10)
    async def index(task: obsq.Task) -> None:
        pass

    with pytest.raises(ValueError, match="give each enqueue a debounce_key"):
        await client.enqueue("index:doc", 1)
    with pytest.raises(ValueError, match="cannot be debounced"):
        obsq.chain(obsq.Job("index:doc", 1, debounce_key="k"))
    assert namespace_keys(raw_redis, namespace) == []
    info = await client.enqueue("index:doc", 1, debounce_key="k")
    stored = raw_redis.hgetall(QueueKeys(namespace, "default").task(info.id))
    assert int(stored[b"due"]) - int(stored[b"enq"]) == 2000
    with pytest.raises(ValueError, match="debounce_max needs its debounce"):
        app.task("other", debounce_max=3)
    with pytest.raises(ValueError, match="must be at least debounce"):
        app.task("other", debounce=3, debounce_max=1)


async def test_the_waiting_task_shows_its_key(client, app, redis_url, namespace,
                                              obsq_cli) -> None:
    @app.task("t")
    async def t(task: obsq.Task) -> None:
        pass

    info = await client.enqueue("t", 1, debounce_key="doc-42", debounce=60)
    async with Inspector(redis_url, namespace) as inspector:
        detail = await inspector.task(info.id)
    assert (detail.state, detail.debounce_key) == ("scheduled", "doc-42")
    code, output = await obsq_cli("task", info.id)
    assert code == 0 and "doc-42" in output and "scheduled" in output


async def test_on_a_redis_cluster_each_key_debounces_in_its_partitions_slot(
        app, redis_cluster, namespace, start_worker) -> None:
    app.queue("events", partitions=3)
    ran: list[tuple[str, int]] = []

    @app.task("t", queue="events")
    async def t(task: obsq.Task) -> None:
        ran.append((task.payload["key"], task.payload["n"]))

    await start_worker(redis_url=redis_cluster)
    client = obsq.Client(redis_cluster, namespace=namespace, app=app)
    try:
        infos = await asyncio.gather(*(
            client.enqueue("t", {"key": f"k{k}", "n": n}, debounce_key=f"k{k}", debounce=0.5)
            for n in range(5) for k in range(6)))
        assert len({i.id for i in infos}) == 6
        assert len({i.partition for i in infos}) > 1
        await wait_until(lambda: len(ran) == 6, what="one run per key")
        assert sorted(ran) == [(f"k{k}", 4) for k in range(6)]
    finally:
        await client.close()
