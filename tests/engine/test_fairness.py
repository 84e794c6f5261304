"""Fairness keys within one queue: the keys with waiting tasks start in turn (the tasks
without a key as one more key), priority orders the tasks of one key, weights give a key more
tasks per turn, and a keyed task keeps its key through every way back to pending."""

from __future__ import annotations

import asyncio
import re
import signal

import httpx
import orjson
import pytest
from support import depth, wait_until

import obsq
from obsq.broker import Attempt, Broker, QueueKeys
from obsq.broker.records import Completion
from obsq.clock import ManualClock
from obsq.engine.fetching import RouteLimits
from obsq.inspection.inspector import Inspector
from obsq.observability.collector import QueueCollector
from obsq.ops.doctor import Doctor
from obsq.ops.ui import create_app

from .helpers import decoded, live_worker_pids, record_key
from .test_limits import most_at_once, spans


async def _fetch(broker: Broker, count: int = 100) -> list[str]:
    """The payloads one fetch takes, in the order it took them."""
    _, fetched = await broker.dequeue("default", count, "w1", 30)
    return [orjson.loads(t.payload) for t in fetched.tasks]


@pytest.fixture
async def stepped(redis_url: str, namespace: str) -> obsq.Client:
    """A client (and its broker) on a clock the test steps."""
    async with obsq.Client(redis_url, namespace, clock=ManualClock()) as client:
        yield client


async def test_a_key_s_backlog_delays_another_key_s_task_by_one_turn(stepped) -> None:
    await stepped.enqueue_many([obsq.Job("t", f"a{n}", fairness_key="A") for n in range(200)])
    await stepped.enqueue("t", "b0", fairness_key="B")
    first = [*await _fetch(stepped.broker, 1), *await _fetch(stepped.broker, 1),
             *await _fetch(stepped.broker, 1)]
    assert "b0" in first[:2]
    assert [p for p in first if p != "b0"] == ["a0", "a1"][:len(first) - 1]
    rest = await _fetch(stepped.broker, 500)
    assert rest == [f"a{n}" for n in range(len(first) - 1, 200)]
    assert (await depth(stepped.broker))["pending"] == 0
    assert await _fetch(stepped.broker) == []


async def test_the_queue_s_latency_counts_the_keyed_tasks(stepped) -> None:
    """A backlog under fairness keys ages the queue's latency as a plain one does: the
    oldest of each key's task next in line."""
    clock = stepped.broker.clock
    await stepped.enqueue_many([obsq.Job("t", f"a{n}", fairness_key="A") for n in range(3)])
    clock.set(clock.now_ms + 30_000)
    await stepped.enqueue("t", "b0", fairness_key="B")
    clock.set(clock.now_ms + 10_000)

    async def latency() -> float:
        return (await stepped.broker.queue_stats(["default"]))["default"].latency

    assert await latency() == pytest.approx(40, abs=0.1)  # A's first, enqueued 40 s ago
    await _fetch(stepped.broker, 2)  # one of A, then B: A's next in line is as old
    assert await latency() == pytest.approx(40, abs=0.1)
    await _fetch(stepped.broker, 10)
    assert await latency() == 0


async def test_keys_take_turns_in_one_fetch_and_no_key_is_one_key(stepped) -> None:
    await stepped.enqueue_many([obsq.Job("t", f"a{n}", fairness_key="A") for n in range(3)])
    await stepped.enqueue_many([obsq.Job("t", f"n{n}") for n in range(3)])
    await stepped.enqueue_many([obsq.Job("t", f"b{n}", fairness_key="B") for n in range(3)])
    taken = await _fetch(stepped.broker, 100)
    assert sorted(taken) == sorted([*(f"a{n}" for n in range(3)), *(f"n{n}" for n in range(3)),
                                    *(f"b{n}" for n in range(3))])
    # one task of each of the three keys in every round of three
    for start in range(0, 9, 3):
        assert {p[0] for p in taken[start:start + 3]} == {"a", "n", "b"}
    for key in "anb":  # each key's tasks in enqueue order
        assert [p for p in taken if p[0] == key] == [f"{key}{n}" for n in range(3)]


async def test_priority_orders_the_tasks_of_one_key(stepped) -> None:
    await stepped.enqueue_many([obsq.Job("t", name, fairness_key="A", priority=p)
                                for p, name in [(0, "low"), (7, "high"), (3, "mid"),
                                                (7, "high2")]])
    assert await _fetch(stepped.broker) == ["high", "high2", "mid", "low"]


async def test_weights_give_a_key_more_tasks_per_turn(stepped, redis_url, namespace) -> None:
    await stepped.enqueue_many([obsq.Job("t", f"v{n}", fairness_key="vip") for n in range(30)])
    await stepped.enqueue_many([obsq.Job("t", f"o{n}", fairness_key="other")
                                for n in range(30)])
    app = obsq.App(namespace)
    app.fairness_weights("default", {"vip": 3})
    broker = Broker(redis_url, namespace, fairness_weights=app.weights_by_queue)
    try:
        taken = await _fetch(broker, 20)
    finally:
        await broker.close()
    assert sum(p[0] == "v" for p in taken) == 15
    assert sum(p[0] == "o" for p in taken) == 5
    with pytest.raises(ValueError, match="fairness weight"):
        app.fairness_weights("default", {"vip": 0})


async def test_cancel_delete_depth_and_the_ring_s_end(stepped, raw_redis, namespace) -> None:
    infos = await stepped.enqueue_many([obsq.Job("t", n, fairness_key=f"k{n % 2}")
                                        for n in range(4)])
    plain = await stepped.enqueue("t", "plain")
    assert (await depth(stepped.broker))["pending"] == 5
    assert await stepped.cancel(infos[0].id) == "cancelled"
    await stepped.delete(infos[2].id)  # k0 has no task left: it leaves the ring
    k = QueueKeys(namespace, "default")
    assert set(decoded(raw_redis.lrange(k.fair_ring, 0, -1))) == {"", "k1"}
    assert (await depth(stepped.broker))["pending"] == 3
    assert sorted(map(str, await _fetch(stepped.broker))) == ["1", "3", "plain"]
    assert not raw_redis.exists(k.fair_ring)
    assert not raw_redis.exists(k.fair("k1"))
    assert (await depth(stepped.broker))["pending"] == 0
    assert plain.id


async def test_a_purge_of_pending_takes_the_keyed_tasks(stepped, inspector, raw_redis,
                                                        namespace) -> None:
    await stepped.enqueue_many([obsq.Job("t", n, fairness_key=f"k{n % 7}") for n in range(50)])
    await stepped.enqueue_many([obsq.Job("t", n) for n in range(5)])
    assert await inspector.purge("default", "pending") == 55
    assert (await depth(stepped.broker))["pending"] == 0
    assert await _fetch(stepped.broker) == []
    k = QueueKeys(namespace, "default")
    assert not [key for key in raw_redis.scan_iter(match=f"{k.prefix}fair*")
                if key.decode() not in (k.fair_count, k.prefix + "fairseq")]


async def test_a_route_computes_the_key_from_the_payload(app, client, broker) -> None:
    @app.task("report", fairness_key=lambda payload: payload["tenant"])
    async def report(task: obsq.Task) -> None:
        pass

    await client.enqueue_many([obsq.Job("report", {"tenant": "a", "n": n}) for n in range(5)])
    await client.enqueue("report", {"tenant": "b", "n": 0})
    await client.enqueue("report", {"tenant": "c", "n": 0}, fairness_key="b")
    taken = [(p["tenant"], p["n"]) for p in await _fetch(broker, 3)]
    assert ("b", 0) in taken[:2]
    with obsq.SyncClient(client.broker.url, client.namespace, app=app) as sync:
        sync.enqueue("report", {"tenant": "z", "n": 1}, fairness_key="z")
    assert ("z", 1) in [(p["tenant"], p["n"]) for p in await _fetch(broker, 3)]


async def test_a_bad_key_is_refused_at_enqueue(client) -> None:
    with pytest.raises(ValueError, match="fairness_key"):
        await client.enqueue("t", fairness_key="{tag}")


async def test_retries_and_hand_backs_keep_the_key(stepped, raw_redis, namespace) -> None:
    broker = stepped.broker
    await stepped.enqueue_many([obsq.Job("t", f"a{n}", fairness_key="A") for n in range(3)])
    _, fetched = await broker.dequeue("default", 1, "w1", 30)
    task = fetched.tasks[0]
    assert await broker.hand_back("default", [Attempt(task.id, task.fence, "t")], "w1") == [True]
    k = QueueKeys(namespace, "default")
    assert task.id in decoded(raw_redis.zrange(k.fair("A"), 0, -1))
    assert not raw_redis.llen(k.pending)
    assert await _fetch(broker, 1) == ["a0"]  # handed back: first of its key again


async def test_a_sigkilled_worker_s_keyed_tasks_come_back_under_their_key(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    first = spawn_worker("--lease-seconds", "60", concurrency=2)
    await wait_until(lambda: _registered(broker, first), timeout=20)
    slow = await client.enqueue_many([obsq.Job("sleep", {"first": 60, "then": 0.05},
                                               fairness_key="A", retention=60)
                                      for _ in range(2)])
    await wait_until(lambda: len(_list(raw_redis, namespace, "started")) == 2, timeout=20)
    first.signal(signal.SIGKILL)
    first.wait()
    backlog = await client.enqueue_many([obsq.Job("sleep", {"first": 0}, fairness_key="A",
                                                  retention=60) for _ in range(6)])
    other = await client.enqueue("sleep", {"first": 0}, fairness_key="B", retention=60)

    async def lost() -> list[str]:
        return await broker.lost_workers()

    await wait_until(lost, timeout=20, what="the killed worker's heartbeat key expired")
    assert (await broker.recover("default", 5, 1000, await lost()))[0] == 2
    k = QueueKeys(namespace, "default")
    assert {i.id for i in slow} <= set(decoded(raw_redis.zrange(k.fair("A"), 0, -1)))
    second = spawn_worker("--lease-seconds", "60", concurrency=1)
    ids = {i.id for i in [*slow, *backlog, other]}
    await wait_until(lambda: set(_list(raw_redis, namespace, "finished")) == ids, timeout=30)
    started = _list(raw_redis, namespace, "started")[2:]  # after the two killed attempts
    assert sorted(started) == sorted(ids)  # nothing lost, nothing twice
    assert other.id in started[:2]  # B's one task does not wait behind A's backlog
    assert second.poll() is None
    assert (await Doctor(broker).diagnose()).clean


async def _registered(broker: Broker, worker) -> bool:
    return worker.pid in await live_worker_pids(broker)


def _list(raw_redis, namespace: str, name: str) -> list[str]:
    return decoded(raw_redis.lrange(record_key(namespace, name), 0, -1))


async def test_key_concurrency_holds_per_key_across_two_workers(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    workers = [spawn_worker(concurrency=4) for _ in range(2)]
    await wait_until(lambda: _all_registered(broker, workers), timeout=30)
    await client.enqueue_many([obsq.Job("keyed", {"key": key, "seconds": 0.05},
                                        fairness_key=key)  # a Client without the App
                               for _ in range(10) for key in "AB"])
    await wait_until(lambda: raw_redis.llen(record_key(namespace, "span")) == 20, timeout=60,
                     what="20 keyed tasks done")
    done = spans(raw_redis, namespace)
    for key in "AB":
        assert most_at_once([(s, e) for s, e, _, p in done if p["key"] == key]) == 1
    assert most_at_once([(s, e) for s, e, _, _ in done]) == 2  # the keys side by side
    k = QueueKeys(namespace, "default")
    await wait_until(lambda: not [*raw_redis.scan_iter(match=f"{k.prefix}running:*")],
                     what="every slot given back")
    assert not raw_redis.smembers(k.prefix + "holds")
    assert int(raw_redis.get(k.prefix + "waiting") or 0) == 0
    assert (await Doctor(broker).diagnose()).clean


async def test_a_key_rate_limit_paces_each_key_apart(app, start_env) -> None:
    started: list[tuple[str, float]] = []

    @app.task("paced", key_rate_limit="6/m")  # per key: one start per 10 s, two at once
    async def paced(task: obsq.Task):
        started.append((task.payload, env.clock.time() - start))

    env = await start_env()
    start = env.clock.time()
    await env.client.enqueue_many([obsq.Job("paced", key, fairness_key=key)
                                   for _ in range(3) for key in "AB"])
    await env.drain()
    assert sorted(started) == [("A", 0), ("A", 0), ("B", 0), ("B", 0)]
    await env.advance(30)
    assert sorted(started) == [("A", 0), ("A", 0), ("A", 20), ("B", 0), ("B", 0), ("B", 20)]


async def test_a_task_held_for_its_key_waits_apart_and_comes_back_first_of_its_key(
        stepped, namespace) -> None:
    """Fetch by fetch, as a worker does: a key's tasks over its limit are held in the key's
    own hold (doctor finds it sound), the other keys go on, and an end lets the best out."""
    broker = stepped.broker
    app = obsq.App(namespace)

    @app.task("t", key_concurrency=1)
    async def t(task: obsq.Task) -> None:
        pass

    limits = RouteLimits(app, None).encoded()
    await stepped.enqueue_many([obsq.Job("t", f"a{n}", fairness_key="A") for n in range(3)])
    await stepped.enqueue_many([obsq.Job("t", f"b{n}", fairness_key="B") for n in range(2)])
    _, fetched = await broker.dequeue("default", 10, "w1", 30, limits=limits)
    assert sorted(orjson.loads(t.payload) for t in fetched.tasks) == ["a0", "b0"]
    assert sorted(why for _, why in fetched.held) == ["concurrency"] * 3
    assert (await depth(broker))["pending"] == 3
    assert (await Doctor(broker).diagnose()).clean
    a0 = next(t for t in fetched.tasks if orjson.loads(t.payload) == "a0")
    assert a0.slot == "t\nA"
    attempt = Attempt(a0.id, a0.fence, a0.type, a0.slot)
    assert await broker.ack({"default": [Completion(attempt, 0, b"null")]}, "w1")
    _, fetched = await broker.dequeue("default", 10, "w1", 30, limits=limits)
    assert [orjson.loads(t.payload) for t in fetched.tasks] == ["a1"]  # b1 waits for b0
    assert (await Doctor(broker).diagnose()).clean


async def _all_registered(broker: Broker, workers) -> bool:
    live = await live_worker_pids(broker)
    return all(w.pid in live for w in workers)


async def test_the_tools_and_the_metrics_show_the_keys_with_most_waiting(
        client, broker, redis_url, namespace, obsq_cli) -> None:
    await client.enqueue_many([obsq.Job("t", n, fairness_key=f"tenant-{k}")
                               for k in range(15) for n in range(k + 1)])
    await client.enqueue("t", "plain")
    top = [(f"tenant-{k}", k + 1) for k in range(14, 4, -1)]  # the ten with most
    inspector = Inspector(redis_url, namespace)
    try:
        q = await inspector.queue("default")
        assert (q.keys_waiting, q.top_keys) == (15, top)
        page = await inspector.tasks("default", "pending", limit=200)
        assert page.total == sum(range(1, 16)) + 1
        assert [t.payload for t in page.tasks[:1]] == ['"plain"']
        assert len({t.id for t in page.tasks}) == page.total
        assert q.depth["pending"] == sum(range(1, 16)) + 1
        console = create_app(inspector)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                     base_url="http://console.test") as http:
            page = (await http.get("/queues/default")).text
        assert "15 with waiting tasks" in page
        assert re.findall(r'<code>(tenant-\d+)</code>', page) == [k for k, _ in top]
    finally:
        await inspector.close()
    code, out = await obsq_cli("queues", "default")
    assert code == 0 and "15 fairness keys with waiting tasks" in out
    assert [line.split()[:2] for line in out.splitlines() if "tenant-" in line] == [
        [k, str(n)] for k, n in top]
    collector = QueueCollector(broker, asyncio.get_running_loop(), ["default"],
                               cache_seconds=0)
    families = {f.name: f for f in await asyncio.to_thread(lambda: list(collector.collect()))}
    assert [s.value for s in families["obsq_queue_fairness_keys"].samples] == [15]
    assert [(s.labels["key"], s.value) for s in
            families["obsq_queue_fairness_key_waiting"].samples] == top


async def test_doctor_finds_nothing_amiss_with_waiting_keys(stepped) -> None:
    await stepped.enqueue_many([obsq.Job("t", n, fairness_key=f"k{n}") for n in range(5)])
    await stepped.enqueue("t", "plain")
    assert (await Doctor(stepped.broker).diagnose()).clean


async def test_a_queue_without_keys_writes_no_fairness_key(client, broker, raw_redis,
                                                           namespace) -> None:
    await client.enqueue_many([obsq.Job("t", n, priority=n % 2) for n in range(5)])
    assert len(await _fetch(broker)) == 5
    k = QueueKeys(namespace, "default")
    assert not [key for key in raw_redis.scan_iter(match=f"{k.prefix}fair*")]


class TestOnACluster:
    @pytest.fixture
    def redis_url(self, redis_cluster: str) -> str:
        return redis_cluster

    async def test_fairness_keys_on_a_cluster(self, client, broker) -> None:
        """Every queue's fairness keys share its hash tag: each queue's scripts stay in its
        slot, on whichever master holds it."""
        for queue in ("alpha", "beta", "delta"):  # one on each master (test_cluster.py)
            await client.enqueue_many([obsq.Job("t", f"a{n}", queue=queue, fairness_key="A")
                                       for n in range(5)])
            await client.enqueue("t", "b0", queue=queue, fairness_key="B")
            _, fetched = await broker.dequeue(queue, 3, "w1", 30)
            assert "b0" in [orjson.loads(t.payload) for t in fetched.tasks][:2]
            _, rest = await broker.dequeue(queue, 100, "w1", 30)
            assert len(fetched.tasks + rest.tasks) == 6
            assert (await depth(broker, queue))["active"] == 6
        assert (await Doctor(broker).diagnose()).clean
