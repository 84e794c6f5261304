"""Per-task priority within one queue (0 to 9, higher first; tests/engine/test_priority.py
is about priority between queues): order, FIFO within a level, the priority kept through
every way back to pending, the aging that keeps a low priority from waiting for good, bad
input refused at enqueue, what the tools show, and obsq doctor's checks of the new keys."""

from __future__ import annotations

import re
import signal

import httpx
import orjson
import pytest
from support import depth, wait_until

import obsq
from obsq.broker import Attempt, Broker, QueueKeys
from obsq.broker.records import FetchedTask
from obsq.clock import ManualClock
from obsq.engine.maintenance import Forwarder
from obsq.inspection.inspector import Inspector
from obsq.ops.doctor import Doctor
from obsq.ops.ui import create_app

from .helpers import decoded, live_worker_pids, record_key

MIX = [(0, "a"), (5, "b"), (9, "c"), (5, "d"), (0, "e"), (9, "f"), (1, "g")]
BY_PRIORITY = ["c", "f", "b", "d", "g", "a", "e"]  # higher first, in enqueue order within


async def _fetch(broker: Broker, count: int = 100) -> list[tuple[str, str]]:
    """(id, payload) of what one fetch takes, in the order it took them."""
    return [(t.id, orjson.loads(t.payload)) for t in await _attempts(broker, count)]


async def _attempts(broker: Broker, count: int) -> list[FetchedTask]:
    _, fetched = await broker.dequeue("default", count, "w1", 30)
    return fetched.tasks


@pytest.fixture
async def stepped(redis_url: str, namespace: str) -> obsq.Client:
    """A client (and its broker) on a clock the test steps."""
    async with obsq.Client(redis_url, namespace, clock=ManualClock()) as client:
        yield client


async def test_higher_priority_first_and_equal_priorities_in_enqueue_order(stepped) -> None:
    await stepped.enqueue_many([obsq.Job("t", name, priority=p) for p, name in MIX])
    taken = [name for _, name in await _fetch(stepped.broker, 3)]
    taken += [name for _, name in await _fetch(stepped.broker, 1)]
    taken += [name for _, name in await _fetch(stepped.broker)]
    assert taken == BY_PRIORITY
    assert await _fetch(stepped.broker) == []


async def test_a_worker_runs_the_higher_priorities_first(app, client, start_worker) -> None:
    ran: list[str] = []
    told: dict[str, int] = {}

    @app.task("t")
    async def record(task: obsq.Task) -> None:
        ran.append(task.payload)
        told[task.payload] = task.priority  # a handler reads its task's priority

    for p, name in MIX:  # one call each: the enqueue order is that of MIX
        await client.enqueue("t", name, priority=p)
    await start_worker(concurrency=1)
    await wait_until(lambda: len(ran) == len(MIX), timeout=20)
    assert ran == BY_PRIORITY
    assert told == {name: p for p, name in MIX}


async def test_route_and_job_priorities(app, client, broker) -> None:
    @app.task("urgent", priority=8)
    async def urgent(task: obsq.Task) -> None:
        pass

    @app.task("plain")
    async def plain(task: obsq.Task) -> None:
        pass

    infos = await client.enqueue_many([obsq.Job("urgent", 1), obsq.Job("urgent", 2, priority=3),
                                       obsq.Job("plain", 3)])
    assert [i.priority for i in infos] == [8, 3, 0]
    assert [(await client.info(i.id)).priority for i in infos] == [8, 3, 0]
    with obsq.SyncClient(client.broker.url, client.namespace, app=app) as sync:
        info = sync.enqueue("plain", 4, priority=6)
        assert sync.info(info.id).priority == 6
    assert [name for _, name in await _fetch(broker)] == [1, 4, 2, 3]


@pytest.mark.parametrize("bad", [10, -1, "high", True, 2.0])
async def test_a_bad_priority_is_refused_at_enqueue(client, broker, bad) -> None:
    with pytest.raises((ValueError, TypeError), match="priority must be"):
        await client.enqueue("t", priority=bad)
    with pytest.raises((ValueError, TypeError), match="priority must be"):
        await client.enqueue_many([obsq.Job("t", 1), obsq.Job("t", 2, priority=bad)])
    with pytest.raises((ValueError, TypeError), match="priority must be"):
        obsq.App().task("t", priority=bad)
    assert (await depth(broker))["pending"] == 0  # nothing of the batch was written


async def test_a_grouped_task_takes_no_priority(client) -> None:
    with pytest.raises(ValueError, match="takes no priority"):
        await client.enqueue("t", 1, group="g", priority=3)


async def test_priority_kept_through_delay_retry_hand_back_recovery_and_requeue(
        stepped, inspector, namespace) -> None:
    broker, clock = stepped.broker, stepped.broker.clock
    k = QueueKeys(namespace, "default")
    info = await stepped.enqueue("t", "x", priority=4, delay=5)
    await stepped.enqueue("t", "plain")

    async def where() -> list[str]:
        """The lists holding the task, and its state."""
        lists = [name for name in ("pending", "pending:4")
                 if info.id.encode() in await broker.redis.lrange(k.prefix + name, 0, -1)]
        return [*lists, (await stepped.info(info.id)).state]

    clock.set(clock.now_ms + 6000)
    await Forwarder(broker, "f", 60, lock_ttl=5).work()  # delay -> pending:4
    assert await where() == ["pending:4", "pending"]

    async def take() -> Attempt:
        [task] = await _attempts(broker, 1)
        assert task.id == info.id  # before the older task of priority 0
        return Attempt(task.id, task.fence, task.type)

    assert await broker.retry("default", await take(), "w1", 0, "boom")
    assert await where() == ["pending:4", "pending"]
    assert await broker.retry("default", await take(), "w1", 2, "boom")  # via the retry set
    clock.set(clock.now_ms + 3000)
    await Forwarder(broker, "f", 60, lock_ttl=5).work()
    assert await where() == ["pending:4", "pending"]
    assert await broker.hand_back("default", [await take()], "w1") == [True]
    assert await where() == ["pending:4", "pending"]
    await take()
    clock.set(clock.now_ms + 31_000)  # its lease ends
    assert (await broker.recover("default", 5, 100))[0] == 1
    assert await where() == ["pending:4", "pending"]
    attempt = await take()
    assert await broker.fail("default", attempt, "w1", "dead")
    assert await where() == ["dead"]
    await inspector.requeue("default", "dead", [info.id])
    assert await where() == ["pending:4", "pending"]
    assert [name for _, name in await _fetch(broker)] == ["x", "plain"]


async def test_aging_serves_a_low_priority_behind_a_stream_of_high_ones(stepped) -> None:
    """Each 100 ms of the clock a task of priority 9 arrives and one task is fetched: the
    task of priority 0 waiting from the start is served once it has waited 9 agings."""
    broker, clock = stepped.broker, stepped.broker.clock
    broker.priority_aging = 1.0
    low = await stepped.enqueue("t", "low")
    start = clock.now_ms
    served_at = None
    for _ in range(200):
        clock.set(clock.now_ms + 100)
        await stepped.enqueue("t", "high", priority=9)
        taken = await _fetch(broker, 1)
        if taken[0][0] == low.id:
            served_at = clock.now_ms
            break
    assert served_at is not None, "the low priority was starved"
    waited = (served_at - start) / 1000
    print(f"\npriority 0 behind a stream of 9 (aging 1 s): served after {waited:.1f} s "
          f"(bound: 9 agings = 9.0 s, plus one step)")
    assert 9.0 <= waited <= 9.1


async def test_one_fetch_merges_the_priorities_by_rank(stepped) -> None:
    """Aging 1 s: tasks of priority 0 from t=0 rank between one of priority 9 sent at 8.5 s
    (rank -0.5 s) and one sent at 9.5 s (0.5 s); one fetch takes them in that order."""
    broker, clock = stepped.broker, stepped.broker.clock
    broker.priority_aging = 1.0
    await stepped.enqueue_many([obsq.Job("t", "low 1"), obsq.Job("t", "low 2")])
    start = clock.now_ms
    for at, name in ((8500, "high 1"), (9500, "high 2")):
        clock.set(start + at)
        await stepped.enqueue("t", name, priority=9)
    assert [name for _, name in await _fetch(broker)] == ["high 1", "low 1", "low 2",
                                                         "high 2"]


async def test_strict_order_while_no_task_has_aged(stepped) -> None:
    broker, clock = stepped.broker, stepped.broker.clock
    await stepped.enqueue("t", "old low")
    clock.set(clock.now_ms + 50_000)  # 50 s of the default 60 s aging: under one level
    await stepped.enqueue("t", "new high", priority=1)
    assert [name for _, name in await _fetch(broker)] == ["new high", "old low"]


async def test_a_sigkilled_worker_s_tasks_come_back_with_their_priority(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    first = spawn_worker("--lease-seconds", "60", concurrency=2)
    await wait_until(lambda: _registered(broker, first), timeout=20)
    slow = await client.enqueue_many([obsq.Job("sleep", {"first": 60, "then": 0.05},
                                               priority=7, retention=60) for _ in range(2)])
    await wait_until(lambda: len(_list(raw_redis, namespace, "started")) == 2, timeout=20)
    first.signal(signal.SIGKILL)
    first.wait()
    # behind them, while they are away: a backlog of priority 0 and one of priority 3
    backlog = await client.enqueue_many([obsq.Job("sleep", {"first": 0}) for _ in range(6)])
    middle = await client.enqueue("sleep", {"first": 0}, priority=3)

    async def lost() -> list[str]:
        return await broker.lost_workers()

    await wait_until(lost, timeout=20, what="the killed worker's heartbeat key expired")
    # taken back as the recoverer does it, before any worker runs again
    assert (await broker.recover("default", 5, 1000, await lost()))[0] == 2
    assert set(decoded(await broker.redis.lrange(QueueKeys(namespace, "default").pending_of(7),
                                                 0, -1))) == {i.id for i in slow}
    second = spawn_worker("--lease-seconds", "60", concurrency=1)
    ids = {i.id for i in [*slow, *backlog, middle]}
    await wait_until(lambda: set(_list(raw_redis, namespace, "finished")) == ids, timeout=30)
    started = _list(raw_redis, namespace, "started")[2:]  # after the two killed attempts
    # the recovered tasks kept priority 7: first of all, then 3, then the backlog
    assert set(started[:2]) == {i.id for i in slow}
    assert started[2] == middle.id
    assert started[3:] == [i.id for i in backlog]
    assert [(await client.info(i.id)).priority for i in slow] == [7, 7]
    assert second.poll() is None
    assert (await Doctor(broker).diagnose()).clean


async def _registered(broker: Broker, worker) -> bool:
    return worker.pid in await live_worker_pids(broker)


def _list(raw_redis, namespace: str, name: str) -> list[str]:
    return decoded(raw_redis.lrange(record_key(namespace, name), 0, -1))


async def test_cancel_delete_purge_pause_and_depth_see_every_priority(stepped, inspector,
                                                                     namespace) -> None:
    broker = stepped.broker
    infos = await stepped.enqueue_many([obsq.Job("t", n, priority=n % 3 * 4) for n in range(9)])
    assert (await depth(broker))["pending"] == 9
    assert await stepped.cancel(infos[4].id) == "cancelled"  # priority 4
    assert await stepped.delete(infos[8].id) == "pending"  # priority 8
    assert (await depth(broker))["pending"] == 7
    await broker.set_paused("default", True)
    assert await _fetch(broker) == []
    await broker.set_paused("default", False)
    assert await broker.redis.llen(QueueKeys(namespace, "default").wake) > 0
    assert await broker.unfinished(["default"], "nobody") == 7
    await inspector.purge("default", "pending")
    assert (await depth(broker))["pending"] == 0
    assert await _fetch(broker) == []
    assert (await Doctor(broker).diagnose()).clean


async def test_the_inspector_and_the_cli_show_priorities(client, inspector, obsq_cli) -> None:
    infos = [await client.enqueue("t", n, priority=p) for n, p in enumerate((2, 7, 0))]
    page = await inspector.tasks("default", "pending")
    assert [(t.id, t.priority) for t in page.tasks] == [
        (infos[1].id, 7), (infos[0].id, 2), (infos[2].id, 0)]  # the highest first
    assert (await inspector.task(infos[1].id)).priority == 7
    code, out = await obsq_cli("tasks", "default", "pending")
    assert code == 0 and "priority" in out.splitlines()[0]
    assert [line.split()[2] for line in out.splitlines()[1:4]] == ["7", "2", "0"]
    code, out = await obsq_cli("task", infos[1].id)
    assert code == 0 and any(line.split() == ["priority", "7"] for line in out.splitlines())


async def test_doctor_finds_and_marks_a_priority_list_no_worker_would_fetch(
        client, broker, namespace) -> None:
    await client.enqueue_many([obsq.Job("t", n, priority=5) for n in range(3)])
    doctor = Doctor(broker)
    assert (await doctor.diagnose()).clean
    await broker.redis.delete(QueueKeys(namespace, "default").levels)  # as if lost
    found = await doctor.diagnose()
    assert [(p.what, p.count, p.repair) for p in found.problems] == [
        ("priorities whose pending list is not named in levels (not fetched)", 1, "mark")]
    await doctor.repair(found)
    assert (await doctor.diagnose()).clean
    assert len(await _fetch(broker)) == 3


async def test_a_flow_step_keeps_its_priority(client, broker) -> None:
    flow = await client.enqueue(obsq.chain(obsq.Job("t", "first", priority=6),
                                           obsq.Job("t", "second", priority=2)))
    info = await client.info(flow.steps[0].id)
    assert info.priority == 6


async def test_a_queue_of_priority_0_only_writes_no_priority_key(client, broker, raw_redis,
                                                                 namespace) -> None:
    await client.enqueue_many([obsq.Job("t", n) for n in range(5)])
    await client.enqueue("t", 5, delay=0.001)
    assert len(await _fetch(broker)) == 5
    k = QueueKeys(namespace, "default")
    assert not [key for key in raw_redis.scan_iter(match=f"{k.pending}:*")]
    assert not raw_redis.exists(k.levels)


class TestOnACluster:
    @pytest.fixture
    def redis_url(self, redis_cluster: str) -> str:
        return redis_cluster

    async def test_priorities_on_a_cluster(self, client, broker) -> None:
        """Every queue's priority lists share its hash tag: each queue's scripts stay in its
        slot, on whichever master holds it."""
        for queue in ("alpha", "beta", "delta"):  # one on each master (test_cluster.py)
            await client.enqueue_many([obsq.Job("t", name, queue=queue, priority=p)
                                       for p, name in MIX])
            _, fetched = await broker.dequeue(queue, 3, "w1", 30)
            _, rest = await broker.dequeue(queue, 100, "w1", 30)
            assert [orjson.loads(t.payload) for t in fetched.tasks + rest.tasks] == BY_PRIORITY
            assert (await depth(broker, queue))["active"] == len(MIX)
        assert (await Doctor(broker).diagnose()).clean


async def test_the_console_shows_priorities(client, redis_url, namespace) -> None:
    info = await client.enqueue("t", 1, priority=8)
    await client.enqueue("t", 2)
    console = create_app(Inspector(redis_url, namespace))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                 base_url="http://console.test") as http:
        page = (await http.get("/queues/default?state=pending")).text
        assert '<th class="n">Priority</th>' in page
        assert re.findall(r'data-label="Priority">(\d)<', page) == ["8", "0"]
        page = (await http.get(f"/tasks/{info.id}")).text
        assert "<dt>Priority</dt><dd>8</dd>" in page


def test_a_schedule_takes_a_priority() -> None:
    app = obsq.App()
    app.periodic("@every 30s", "report", priority=4)
    with pytest.raises(ValueError, match="priority must be"):
        app.periodic("@every 30s", "other", priority=12)


async def test_a_priority_written_by_hand_as_junk_counts_as_0(client, broker, raw_redis,
                                                              namespace) -> None:
    info = await client.enqueue("t", 1, priority=3)
    [task] = await _attempts(broker, 1)
    raw_redis.hset(QueueKeys(namespace, "default").task(info.id), "pri", "x:y")
    assert await broker.hand_back("default", [Attempt(task.id, task.fence, "t")], "w1") == [True]
    assert [task_id for task_id, _ in await _fetch(broker)] == [info.id]
    assert not [key for key in raw_redis.scan_iter(match=f"{namespace}:*pending:x*")]
