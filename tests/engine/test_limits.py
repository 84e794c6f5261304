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
from support import depth, wait_until

import obsq
from obsq.broker import QueueKeys
from obsq.clock import ManualClock
from obsq.engine.fetching import RouteLimits
from obsq.engine.maintenance import Forwarder

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
    assert not raw_redis.llen(keys.prefix + "held:limited")
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
