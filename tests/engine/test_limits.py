"""Route limits and ordering keys across several worker processes on a real Redis: a route's
concurrency across all workers, its rate, one task at a time per ordering key, a worker's
own route limits, and nothing leaked when a worker holding slots is SIGKILLed.

The handlers of tests/engine/apps.py record each attempt's span on this host's clock; run
with `-s` for the figures. The times a rate limit gives are checked on a clock the test
steps (obsq.testing)."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict

import orjson
import pytest
from support import depth, wait_until

import obsq
from obsq.broker import Attempt, QueueKeys
from obsq.broker.records import Completion, FetchedTask
from obsq.clock import ManualClock
from obsq.engine.fetching import RouteLimits
from obsq.engine.maintenance import Forwarder
from obsq.ops.doctor import Doctor

from .helpers import record_key


def spans(raw_redis, namespace: str) -> list[tuple[float, float, str, object]]:
    """(start s, end s, id, payload) of every attempt that returned, by start."""
    out = []
    for line in raw_redis.lrange(record_key(namespace, "span"), 0, -1):
        start, end, task_id, payload = line.decode().split(" ", 3)
        out.append((int(start) / 1e6, int(end) / 1e6, task_id, orjson.loads(payload)))
    return sorted(out)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


async def start_workers(spawn_worker, broker, n: int, *extra: str, concurrency: int = 10):
    workers = [spawn_worker(*extra, concurrency=concurrency) for _ in range(n)]
    await wait_until(lambda: _live(broker, n), timeout=30, what=f"{n} workers registered")
    return workers


async def _live(broker, n: int) -> bool:
    return len(await broker.workers()) >= n


async def test_a_route_limit_holds_across_four_workers(client, broker, raw_redis, namespace,
                                                       spawn_worker) -> None:
    await start_workers(spawn_worker, broker, 4)
    await client.enqueue_many([obsq.Job("limited", {"seconds": 0.05}) for _ in range(200)])
    await wait_until(lambda: raw_redis.llen(record_key(namespace, "span")) == 200, timeout=60,
                     what="200 limited tasks done")
    done = spans(raw_redis, namespace)
    assert most_at_once([(s, e) for s, e, _, _ in done]) == 3
    elapsed = done[-1][1] - done[0][0]
    print(f"\n200 tasks of 50 ms limited to 3 across 4 workers: {200 / elapsed:.1f} tasks/s "
          f"(the limit allows {3 / 0.05:.0f}/s)")
    keys = QueueKeys(namespace, "default")
    await wait_until(lambda: not raw_redis.scard(keys.prefix + "running:limited"),
                     what="every slot given back")
    assert not raw_redis.zcard(keys.held("limited"))
    assert int(raw_redis.get(keys.prefix + "waiting") or 0) == 0


async def test_a_rate_limit_holds_across_three_workers(redis_url, namespace) -> None:
    """Three workers take 600 tasks of a route limited to 200 starts a second, each every
    5 ms of a clock the test steps, the forwarder letting the reserved starts out: in every
    one-second window of the clock, at most the rate plus the burst of one it tolerates."""
    paced = obsq.App()

    @paced.task("paced", rate_limit="200/s")
    async def handler(task: obsq.Task) -> None:
        pass

    clock = ManualClock()
    limits = RouteLimits(paced, None).encoded()
    admitted: list[int] = []
    async with obsq.Client(redis_url, namespace, app=paced, clock=clock) as client:
        broker = client.broker
        await client.enqueue_many([obsq.Job("paced", n) for n in range(600)])
        forwarder = Forwarder(broker, "forwarder", 60, lock_ttl=5)
        while len(admitted) < 600:
            await forwarder.work()
            for worker in ("w0", "w1", "w2"):
                _, fetched = await broker.dequeue("default", 10, worker, 30, limits=limits)
                admitted += [fetched.now_ms] * len(fetched.tasks)
            clock.set(clock.now_ms + 5)
        assert (await depth(broker))["scheduled"] == 0
    windows = [sum(1 for t in admitted if s <= t < s + 1000) for s in admitted
               if s + 1000 <= admitted[-1]]
    print(f"\n600 starts at 200/s over 3 workers: {600 / (admitted[-1] - admitted[0]) * 1000:.1f}"
          f"/s overall; per 1-s window of the clock {min(windows)} to {max(windows)}")
    assert max(windows) <= 201
    assert 600 / (admitted[-1] - admitted[0]) * 1000 <= 201


async def test_an_ordering_key_runs_one_at_a_time_in_order(client, broker, raw_redis, namespace,
                                                           spawn_worker) -> None:
    await start_workers(spawn_worker, broker, 4)
    jobs = [obsq.Job("ordered", {"key": k, "seq": n, "fail_once": (k, n) == (0, 10)},
                     ordering_key=f"acct-{k}", max_retry=3)
            for n in range(100) for k in range(5)]
    await client.enqueue_many(jobs)
    await wait_until(lambda: raw_redis.llen(record_key(namespace, "span")) == 501, timeout=90,
                     what="500 ordered tasks done, one of them twice")
    by_key: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    everything = []
    for start, end, _, payload in spans(raw_redis, namespace):
        by_key[payload["key"]].append((start, end, payload["seq"]))
        everything.append((start, end))
    for key, runs in by_key.items():
        assert [seq for _, _, seq in runs] == sorted(seq for _, _, seq in runs), key  # in order
        assert most_at_once([(s, e) for s, e, _ in runs]) == 1, key  # one at a time
    seqs = [seq for _, _, seq in by_key[0]]
    assert seqs.count(10) == 2 and seqs.index(11) == seqs.index(10) + 2  # its retry kept order
    assert most_at_once(everything) > 1  # different keys ran side by side
    assert (await depth(broker))["pending"] == 0


async def test_a_rate_limit_lets_a_burst_of_two_start_then_one_per_interval(app, start_env
                                                                          ) -> None:
    started: list[float] = []

    @app.task("paced", rate_limit="6/m")  # one start per 10 s, two at once at most
    async def paced(task: obsq.Task):
        started.append(env.clock.time() - start)

    env = await start_env()
    start = env.clock.time()
    await env.client.enqueue_many([obsq.Job("paced", n) for n in range(5)])
    await env.drain()
    assert started == [0, 0]
    await env.advance(19.999)
    assert started == [0, 0]  # the third start is reserved for 20 s
    await env.advance(30)
    assert started == [0, 0, 20, 30, 40]


async def test_a_workers_own_route_limit_does_not_block_the_rest_of_its_queue(
        app, client, start_worker) -> None:
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    done: list[str] = []
    gate = asyncio.Event()

    @app.task("pdf:")
    async def pdf(task: obsq.Task):
        running["pdf"] += 1
        most["pdf"] = max(most["pdf"], running["pdf"])
        await gate.wait()
        running["pdf"] -= 1
        done.append(task.type)

    @app.task("email:send")
    async def email(task: obsq.Task):
        done.append(task.type)

    await client.enqueue_many([obsq.Job("pdf:render", i) for i in range(20)])
    await client.enqueue_many([obsq.Job("email:send", i) for i in range(5)])
    await start_worker(concurrency=10, route_concurrency="pdf:=2")
    # the emails behind twenty pdfs run while two pdfs hold their slots
    await wait_until(lambda: done.count("email:send") == 5, what="the emails done")
    assert running["pdf"] == 2
    gate.set()
    await wait_until(lambda: len(done) == 25, what="every pdf done")
    assert most["pdf"] == 2


async def test_a_killed_worker_gives_its_route_slots_back(client, broker, raw_redis, namespace,
                                                          spawn_worker) -> None:
    doomed, = await start_workers(spawn_worker, broker, 1)
    await client.enqueue_many([obsq.Job("limited", {"seconds": 2}) for _ in range(3)]
                              + [obsq.Job("limited", {"seconds": 0.01}) for _ in range(5)])
    keys = QueueKeys(namespace, "default")
    await wait_until(lambda: raw_redis.scard(keys.prefix + "running:limited") == 3,
                     what="three slots taken")
    doomed.signal(signal.SIGKILL)  # with the three slots, and five tasks held behind them
    doomed.wait()
    await start_workers(spawn_worker, broker, 1)
    # the three come back and run again, and the five held ones get their turn
    await wait_until(lambda: raw_redis.llen(record_key(namespace, "span")) == 8, timeout=30,
                     what="all eight done after the kill")
    # a span is recorded before its handler returns, and the slot freed by the ack after it
    await wait_until(lambda: not raw_redis.scard(keys.prefix + "running:limited"),
                     what="every slot given back")
    assert int(raw_redis.get(keys.prefix + "waiting") or 0) == 0


def _waiting(raw_redis, namespace: str) -> int:
    return int(raw_redis.get(QueueKeys(namespace, "default").waiting) or 0)


async def test_a_held_task_of_a_higher_priority_runs_next(app, client, raw_redis, namespace,
                                                          start_worker) -> None:
    """A route of one at a time: twenty tasks of priority 0 held behind the one running,
    then one of priority 9, held too. It runs next, and the twenty after it in the order
    they came (the forwarder letting one out on each pass meanwhile)."""
    ran: list[object] = []
    gate = asyncio.Event()

    @app.task("one", concurrency=1)
    async def one(task: obsq.Task) -> None:
        ran.append(task.payload)
        if task.payload == 0:
            await gate.wait()

    await client.enqueue_many([obsq.Job("one", n) for n in range(21)])
    await start_worker(concurrency=4)
    await wait_until(lambda: ran == [0] and _waiting(raw_redis, namespace) == 20,
                     what="twenty held behind the first")
    await client.enqueue("one", "urgent", priority=9)
    await wait_until(lambda: _waiting(raw_redis, namespace) == 21, what="the urgent one held")
    gate.set()
    await wait_until(lambda: len(ran) == 22, what="every task run")
    assert ran == [0, "urgent", *range(1, 21)]


class _OneAtATime:
    """A route limited to one running task, fetched and ended by hand on a clock the test
    steps (worker w1, its dequeue applying the route's limit)."""

    def __init__(self, client: obsq.Client, limits: bytes) -> None:
        self.client, self.broker, self.limits = client, client.broker, limits
        self.clock = client.broker.clock
        self.running: FetchedTask | None = None

    async def take(self) -> list[str]:
        """The payloads a fetch starts (the rest it holds back)."""
        _, fetched = await self.broker.dequeue("default", 10, "w1", 30, limits=self.limits)
        if fetched.tasks:
            [self.running] = fetched.tasks
        return [orjson.loads(t.payload) for t in fetched.tasks]

    async def end(self) -> None:
        t = self.running
        attempt = Attempt(t.id, t.fence, t.type, t.slot)
        assert await self.broker.ack({"default": [Completion(attempt, 0, b"null")]}, "w1")


@pytest.fixture
async def one_at_a_time(redis_url: str, namespace: str) -> _OneAtATime:
    limited = obsq.App()

    @limited.task("one", concurrency=1)
    async def one(task: obsq.Task) -> None:
        pass

    async with obsq.Client(redis_url, namespace, app=limited, clock=ManualClock()) as client:
        yield _OneAtATime(client, RouteLimits(limited, None).encoded())


async def test_aging_lets_a_held_low_priority_through_a_stream_of_high_ones(
        one_at_a_time) -> None:
    """Aging 1 s. Each 100 ms of the clock a task of priority 9 arrives and is held behind the
    running one, which then ends: the task of priority 0 held from the start runs once it
    has waited 9 agings, as a pending one would (test_task_priority.py)."""
    limited = one_at_a_time
    limited.broker.priority_aging = 1.0
    await limited.client.enqueue("one", "first")
    assert await limited.take() == ["first"]
    await limited.client.enqueue("one", "low")
    assert await limited.take() == []  # held
    start = limited.clock.now_ms
    served_at = None
    for _ in range(200):
        limited.clock.set(limited.clock.now_ms + 100)
        await limited.client.enqueue("one", "high", priority=9)
        assert await limited.take() == []
        await limited.end()
        if await limited.take() == ["low"]:
            served_at = limited.clock.now_ms
            break
    assert served_at is not None, "the held low priority was starved"
    waited = (served_at - start) / 1000
    print(f"\nheld priority 0 behind a stream of held 9 (aging 1 s): ran after {waited:.1f} s "
          f"(bound: 9 agings = 9.0 s, plus one step)")
    assert 9.0 <= waited <= 9.1


async def test_a_held_task_let_out_and_held_again_keeps_its_place(one_at_a_time) -> None:
    """Tasks of one priority, enqueued in one call (the same millisecond), run in the order
    they came, though the forwarder lets the first held out and a fetch holds it again, and
    though it lets it out again just before the running one ends and lets the next out."""
    limited = one_at_a_time
    forwarder = Forwarder(limited.broker, "f", 60, lock_ttl=5)
    await limited.client.enqueue_many([obsq.Job("one", n) for n in range(6)])
    assert await limited.take() == [0]
    assert await limited.take() == []  # the five others held
    await forwarder.work()  # lets 1 out
    assert await limited.take() == []  # held again
    await forwarder.work()  # lets 1 out again
    ran = []
    for _ in range(5):
        await limited.end()  # the first time lets 2 out too, behind 1
        ran += await limited.take()
    assert ran == [1, 2, 3, 4, 5]


async def test_an_ordering_key_s_next_task_goes_to_pending_by_its_priority(stepped_client
                                                                          ) -> None:
    """The next task of an ordering key is not held with others: it waits in its key's list
    and, once the one ahead ends, goes to the pending list of its priority."""
    broker = stepped_client.broker
    await stepped_client.enqueue("t", "first", ordering_key="k")
    await stepped_client.enqueue("t", "next", ordering_key="k", priority=9)
    await stepped_client.enqueue_many([obsq.Job("t", n) for n in range(3)])
    _, fetched = await broker.dequeue("default", 1, "w1", 30)
    [first] = fetched.tasks
    assert orjson.loads(first.payload) == "first"
    attempt = Attempt(first.id, first.fence, first.type, ordering_key="k")
    assert await broker.ack({"default": [Completion(attempt, 0, b"null")]}, "w1")
    _, fetched = await broker.dequeue("default", 10, "w1", 30)
    assert [orjson.loads(t.payload) for t in fetched.tasks] == ["next", 0, 1, 2]


async def test_a_held_task_an_earlier_version_cancelled_is_passed_over(
        one_at_a_time, raw_redis, namespace) -> None:
    """An earlier version's cancel.lua looked for a held task in its list only: the task,
    cancelled, stays in its sorted set until a slot frees, and is passed over then."""
    limited = one_at_a_time
    infos = await limited.client.enqueue_many([obsq.Job("one", n) for n in range(3)])
    assert await limited.take() == [0]
    assert await limited.take() == []
    k = QueueKeys(namespace, "default")
    # what it did: its LREM found nothing, it counted the task out of `waiting`, ended it
    raw_redis.hset(k.task(infos[1].id), mapping={"state": "cancelled", "done": 1})
    raw_redis.zadd(k.cancelled, {infos[1].id: 1})
    raw_redis.decr(k.waiting)
    await limited.end()
    assert await limited.take() == [2]
    assert _waiting(raw_redis, namespace) == 0


@pytest.fixture
async def stepped_client(redis_url: str, namespace: str) -> obsq.Client:
    async with obsq.Client(redis_url, namespace, clock=ManualClock()) as client:
        yield client


def _hold_as_before(raw_redis, namespace: str, pattern: str) -> list[str]:
    """Hold the queue's pending tasks as a version before ranked holds did (its dequeue.lua
    popping each and pushing it on the list `held:<pattern>`), oldest first -> their ids."""
    k = QueueKeys(namespace, "default")
    ids = []
    for list_key in (k.pending_of(p) for p in range(9, -1, -1)):
        while (task_id := raw_redis.rpop(list_key)) is not None:
            ids.append(task_id.decode())
            raw_redis.lpush(k.prefix + "held:" + pattern, task_id)
            raw_redis.sadd(k.prefix + "holding", pattern)
            raw_redis.hset(k.task(task_id.decode()), mapping={"held": pattern, "hc": "1"})
            raw_redis.incr(k.waiting)
    return ids


async def test_tasks_held_by_an_earlier_version_are_kept_and_run(
        app, client, inspector, raw_redis, namespace, start_worker) -> None:
    """Tasks an earlier version held (a list per pattern), during an upgrade: they count as
    pending, are listed, cancelled and purged like the rest, and the forwarder lets them
    out to be held by rank (none lost, the cancelled one never run)."""
    ran: list[object] = []

    @app.task("one", concurrency=1)
    async def one(task: obsq.Task) -> None:
        ran.append(task.payload)

    infos = await client.enqueue_many([obsq.Job("one", n, priority=5 if n == 3 else 0)
                                       for n in range(5)])
    assert len(_hold_as_before(raw_redis, namespace, "one")) == 5
    assert (await depth(client.broker))["pending"] == 5
    page = await inspector.tasks("default", "pending")
    assert [t.id for t in page.tasks] == [infos[n].id for n in (3, 0, 1, 2, 4)]
    assert (await Doctor(client.broker).diagnose()).clean
    assert await client.cancel(infos[1].id) == "cancelled"
    assert await client.delete(infos[2].id) == "pending"
    assert (await depth(client.broker))["pending"] == 3
    await start_worker(concurrency=2)
    await wait_until(lambda: len(ran) == 3, what="the three left run")
    assert ran == [3, 0, 4]  # held anew by rank: the priority 5 first
    k = QueueKeys(namespace, "default")
    assert not raw_redis.exists(k.prefix + "held:one", k.prefix + "holding")
    assert _waiting(raw_redis, namespace) == 0
    assert (await Doctor(client.broker).diagnose()).clean
