"""No task is lost when a worker dies: SIGKILL, SIGTERM drain, a task that kills its own
worker, an expired lease, and a stale attempt that tries to settle (fencing).

Workers that are killed run as subprocesses (`python -m obsq worker tests.engine.apps:app`);
their handlers record each attempt in Redis (see apps.py)."""

from __future__ import annotations

import asyncio
import signal

import pytest
from support import depth, wait_until

import obsq
from obsq.broker import Attempt, Broker, Completion, GlobalKeys
from obsq.broker.keeping import BlockingKeeping

from .helpers import decoded, live_worker_pids, record_key


async def _wait_registered(broker: Broker, *workers) -> None:
    """Until each subprocess has registered its heartbeat (it is fetching by then)."""
    pids = {w.pid for w in workers}

    async def registered() -> bool:
        if any(w.poll() is not None for w in workers):
            raise AssertionError("a worker exited:\n" + "\n".join(w.log() for w in workers))
        return pids <= await live_worker_pids(broker)

    await wait_until(registered, timeout=20, interval=0.05)


def _list(raw_redis, namespace: str, name: str) -> list[str]:
    return decoded(raw_redis.lrange(record_key(namespace, name), 0, -1))


def _attempts(raw_redis, namespace: str, task_id: str) -> int:
    return int(raw_redis.get(record_key(namespace, f"attempts:{task_id}")) or 0)


async def test_sigkill_mid_task_loses_nothing_and_the_heartbeat_brings_tasks_back(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    first = spawn_worker("--lease-seconds", "60")  # concurrency 4
    await _wait_registered(broker, first)
    infos = await client.enqueue_many([obsq.Job("sleep", {"first": 60, "then": 0.05})
                                       for _ in range(4)])
    await wait_until(lambda: len(_list(raw_redis, namespace, "started")) == 4, timeout=20)

    first.signal(signal.SIGKILL)
    first.wait()
    assert (await depth(broker))["active"] == 4

    second = spawn_worker("--lease-seconds", "60")
    await _wait_registered(broker, second)
    later = await client.enqueue_many([obsq.Job("sleep", {"first": 0.05}) for _ in range(4)])
    ids = {i.id for i in [*infos, *later]}
    # the leases run 60 s: only the lost heartbeat can bring the tasks back within the wait
    await wait_until(lambda: set(_list(raw_redis, namespace, "finished")) == ids, timeout=25)
    for info in infos:
        assert _attempts(raw_redis, namespace, info.id) == 2  # killed once, then completed
    for info in later:
        assert _attempts(raw_redis, namespace, info.id) == 1

    async def none_active() -> bool:
        return (await depth(broker))["active"] == 0

    # a handler records its end before it returns; the worker's ack of it follows (with
    # its next fetch), so the last attempts leave `active` a moment after the ledger shows
    await wait_until(none_active, timeout=10)
    assert "(worker_lost)" in second.log()
    assert second.poll() is None


async def test_sigterm_drains_short_tasks_and_hands_long_ones_back(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    worker = spawn_worker("--shutdown-timeout", "2", "--lease-seconds", "60")
    await _wait_registered(broker, worker)
    short = await client.enqueue_many([obsq.Job("sleep", {"first": 0.5}) for _ in range(2)])
    long = await client.enqueue_many([obsq.Job("sleep", {"first": 60, "then": 0.05},
                                               retention=60) for _ in range(2)])
    await wait_until(lambda: len(_list(raw_redis, namespace, "started")) == 4, timeout=20)

    worker.signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0
    # at once, not after a lease: the long tasks are pending again, not counted as retries
    for info in long:
        stored = await client.info(info.id)
        assert (stored.state, stored.retry_count) == ("pending", 0)
    finished = _list(raw_redis, namespace, "finished")
    assert sorted(finished) == sorted(i.id for i in short)
    assert (await depth(broker))["active"] == 0
    assert "handed 2 unfinished task(s) back to pending" in worker.log()

    second = spawn_worker()
    await _wait_registered(broker, second)
    for info in long:
        assert await client.result(info, timeout=20) == {"attempt": 2}
    for info in short:
        assert _attempts(raw_redis, namespace, info.id) == 1


async def test_sigterm_exits_as_soon_as_running_tasks_are_done(
        client, broker, raw_redis, namespace, spawn_worker) -> None:
    worker = spawn_worker("--shutdown-timeout", "120")
    await _wait_registered(broker, worker)
    infos = await client.enqueue_many([obsq.Job("sleep", {"first": 0.3}) for _ in range(4)])
    await wait_until(lambda: len(_list(raw_redis, namespace, "started")) == 4, timeout=20)
    worker.signal(signal.SIGTERM)
    # far below the shutdown timeout of 120 s
    assert await asyncio.to_thread(worker.wait, 30) == 0
    assert sorted(_list(raw_redis, namespace, "finished")) == sorted(i.id for i in infos)
    stats = await depth(broker)
    assert (stats["active"], stats["pending"]) == (0, 0)


async def test_a_task_that_kills_its_worker_ends_in_dead_after_max_recoveries(
        app, client, broker, raw_redis, namespace, spawn_worker, start_worker) -> None:
    # A steady worker on another queue holds the recoverer lock, as a healthy replica
    # would; the poisoned workers serve the default queue and die one after the other.
    steady = await start_worker(queues="steady", max_recoveries=1)
    lock = GlobalKeys(namespace).lock("recoverer")
    await wait_until(lambda: raw_redis.get(lock) == steady.id.encode())
    info = await client.enqueue("poison", retention=60)
    args = ("--max-recoveries", "1", "--lease-seconds", "1")
    restarts = 0
    worker = spawn_worker(*args)

    async def dead_or_restarted() -> bool:
        nonlocal worker, restarts
        if (await client.info(info.id)).state == "dead":
            return True
        if worker.poll() is not None:  # the supervisor: start a new one
            assert worker.poll() == -signal.SIGKILL
            restarts += 1
            assert restarts <= 4, "the poison pill was redelivered too often"
            worker = spawn_worker(*args)
        return False

    await wait_until(dead_or_restarted, timeout=60, interval=0.1)
    dead = await client.info(info.id)
    assert dead.error == ("lost its worker 2 times while it ran alone (max_recoveries 1): "
                          "the task kills its worker")
    # its first loss makes it a suspect, then it runs alone: each loss there counts
    assert _attempts(raw_redis, namespace, info.id) == 3
    with pytest.raises(obsq.TaskFailed, match="kills its worker"):
        await client.result(info, timeout=1)


async def test_an_expired_lease_is_recovered_and_the_stale_attempt_is_fenced(
        app, client, broker, start_worker) -> None:
    recoveries: list[tuple[str, str, int]] = []
    app.on_recovery(lambda queue, reason, count: recoveries.append((queue, reason, count)))

    @app.task("job")
    async def job(task: obsq.Task):
        return f"run by the worker, attempt fence {task._attempt.fence}"

    info = await client.enqueue("job", retention=60)
    # a wedged worker takes the task with a short lease and never extends it
    _, fetched_stale = await broker.dequeue("default", 1, "wedged-worker", lease_seconds=1)
    (stale,) = fetched_stale.tasks
    stale_id, stale_fence = stale.id, stale.fence
    assert stale_id == info.id
    assert (await client.info(info.id)).state == "active"

    await start_worker(lease_seconds=30)
    result = await client.result(info, timeout=15)
    assert result.startswith("run by the worker")
    assert ("default", "expired", 1) in recoveries

    # the wedged worker wakes up: none of its settling calls is accepted
    stale_attempt = Attempt(stale_id, stale_fence)
    acked = await broker.ack({"default": [Completion(stale_attempt, 60, b'"stale"')]},
                             "wedged-worker")
    assert acked == {"default": [False]}
    assert not await broker.retry("default", stale_attempt, "wedged-worker", 0, "x")
    assert not await broker.fail("default", stale_attempt, "wedged-worker", "x")
    assert await broker.hand_back("default", [stale_attempt], "wedged-worker") == [False]
    stored = await client.info(info.id)
    assert (stored.state, stored.result) == ("completed", result)


async def test_fencing_after_recovery_at_the_broker(client, broker) -> None:
    info = await client.enqueue("job")
    _, fetched_first = await broker.dequeue("default", 1, "w1", lease_seconds=0.05)
    (first,) = fetched_first.tasks
    fence = first.fence

    async def recovered() -> bool:
        requeued, *_ = await broker.recover("default", max_recoveries=5, batch=100)
        return requeued == 1

    await wait_until(recovered, timeout=5)
    assert (await client.info(info.id)).state == "pending"
    keeping = BlockingKeeping(broker)  # as a worker's heartbeat thread extends
    assert await asyncio.to_thread(keeping.extend, {"default": [Attempt(info.id, fence)]}, 30,
                                   "w1") == {"default": [info.id]}  # no longer this attempt's
    keeping.close()
    old = Completion(Attempt(info.id, fence), 0, b"1")
    assert await broker.ack({"default": [old]}, "w1") == {"default": [False]}

    _, fetched_second = await broker.dequeue("default", 1, "w2", lease_seconds=30)
    (second,) = fetched_second.tasks
    assert second.id == info.id and second.fence != fence
    # the old attempt cannot settle the new one, even from the same worker id
    assert await broker.ack({"default": [old]}, "w2") == {"default": [False]}
    new = Completion(Attempt(info.id, second.fence), 60, b"2")
    assert await broker.ack({"default": [new]}, "w2") == {"default": [True]}
    stored = await client.info(info.id)
    assert (stored.state, stored.result) == ("completed", 2)


async def test_a_graceful_stop_under_load_is_prompt_and_loses_nothing(
        app, client, broker, redis_url, namespace, start_worker) -> None:
    runs: dict[str, int] = {}

    @app.task("tiny")
    async def tiny(task: obsq.Task):
        runs[task.id] = runs.get(task.id, 0) + 1
        await asyncio.sleep(0.001)

    total = 1500
    infos = await client.enqueue_many([obsq.Job("tiny", i) for i in range(total)])
    worker = obsq.Worker(app, redis_url, concurrency=8, shutdown_timeout=120, handle_signals=False)
    running = asyncio.create_task(worker.run())
    await wait_until(lambda: len(runs) >= 300, timeout=20)
    worker.stop()
    await asyncio.wait_for(running, timeout=20)  # far below the shutdown timeout of 120 s
    stats = await depth(broker)
    assert stats["active"] == 0
    assert stats["pending"] == total - len(runs)  # what did not run is back in pending

    await start_worker()
    await wait_until(lambda: len(runs) == total, timeout=30)
    await wait_until(lambda: _depth(broker, "pending", 0))
    assert {i.id for i in infos} == set(runs)
    assert max(runs.values()) == 1  # a graceful stop runs nothing twice


async def _depth(broker: Broker, state: str, expected: int) -> bool:
    return (await depth(broker))[state] == expected
