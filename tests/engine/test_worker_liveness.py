"""A worker whose event loop is blocked, or whose whole process is frozen, stays one worker:
its heartbeat and leases go on from their own thread, its tasks run once, and a task it
lost while frozen is not started again when it wakes. Real worker subprocesses
(tests/engine/apps.py) on real Redis."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import urllib.error
import urllib.request

import redis
from support import ended, wait_until

import obsq
from obsq.broker import Attempt, Broker, Completion
from obsq.broker.keeping import BlockingKeeping
from obsq.engine.liveness import Claims, Heartbeat
from obsq.redis_server import free_port

BLOCK = 8.0  # seconds the handler blocks the loop: past the heartbeat TTL and the lease
LIVENESS = {"OBSQ_HEARTBEAT_TTL": "3", "OBSQ_HEARTBEAT_INTERVAL": "0.5"}


def records(raw_redis, namespace: str, name: str) -> list[str]:
    return [i.decode() for i in raw_redis.lrange(f"{namespace}:rec:{name}", 0, -1)]


async def test_a_handler_blocking_the_loop_makes_no_task_run_twice(
        spawn_worker, client, raw_redis, namespace, broker: Broker) -> None:
    blocking = spawn_worker("--lease-seconds", "3", **LIVENESS)
    await wait_until(lambda: broker.workers(), what="the first worker")
    # tasks awaiting I/O beside the blocking handler, whose timeouts are shorter than the
    # time the loop stands blocked
    waiting = [await client.enqueue("sleep", {"first": 1}, timeout=3, retention=60)
               for _ in range(2)]
    await wait_until(lambda: len(records(raw_redis, namespace, "started")) == 2)
    blocker = await client.enqueue("block", {"seconds": BLOCK}, retention=60)
    await wait_until(lambda: blocker.id in records(raw_redis, namespace, "started"))
    # a second worker, whose recoverer would take the first one's tasks if it looked lost
    spawn_worker("--lease-seconds", "3", **LIVENESS)

    ids = [blocker.id, *(t.id for t in waiting)]
    await wait_until(lambda: sorted(records(raw_redis, namespace, "finished")) == sorted(ids),
                     timeout=BLOCK + 20, what="every task finished")
    for info in [blocker, *waiting]:  # no false TaskTimeout, no retry
        # "finished" is recorded as the handler returns; its ack follows with the next fetch
        final = await wait_until(lambda i=info: ended(client, i.id), what="settled")
        assert (final.state, final.retry_count, final.error) == ("completed", 0, None), final
    # a task taken back before it completed would be pending ahead of this one
    marker = await client.enqueue("sleep", {"first": 0}, retention=60)
    await wait_until(lambda: marker.id in records(raw_redis, namespace, "finished"))
    ids.append(marker.id)
    assert sorted(records(raw_redis, namespace, "started")) == sorted(ids)
    assert sorted(records(raw_redis, namespace, "finished")) == sorted(ids)
    await wait_until(lambda: "the event loop runs again" in blocking.log())
    log = blocking.log()
    assert "TaskTimeout" not in log and "longer than its timeout" not in log
    assert "lease lost" not in log
    warning = log[log.index("the event loop has been blocked"):]
    assert f"task {blocker.id} (block) of queue default" in warning.splitlines()[0]
    assert "time.sleep(task.payload[\"seconds\"])" in warning  # the blocking line
    assert "the event loop runs again" in warning


async def test_a_frozen_worker_does_not_start_the_tasks_it_lost(
        spawn_worker, client, raw_redis, namespace, broker: Broker) -> None:
    frozen = spawn_worker("--lease-seconds", "3", concurrency=2, **LIVENESS)
    await wait_until(lambda: broker.workers(), what="the first worker")
    # quick tasks first: a worker holds a second batch in its buffer while tasks are short
    quick = [await client.enqueue("sleep", {"first": 0}) for _ in range(12)]
    await wait_until(lambda: len(records(raw_redis, namespace, "finished")) == 12)
    active = f"{namespace}:{{default}}:active"
    # their acks too, so that the count below is of the new tasks alone
    await wait_until(lambda: raw_redis.hlen(active) == 0, what="the quick ones settled")
    long = await client.enqueue_many([obsq.Job("sleep", {"first": 4}) for _ in range(2)])
    buffered = await client.enqueue_many([obsq.Job("sleep", {"first": 0}) for _ in range(2)])
    await wait_until(lambda: raw_redis.hlen(active) == 4, what="2 running, 2 buffered")
    await wait_until(lambda: set(records(raw_redis, namespace, "started")) ==
                     {t.id for t in [*quick, *long]}, what="the long ones started")

    frozen.signal(signal.SIGSTOP)
    try:
        spawn_worker("--lease-seconds", "3", **LIVENESS)  # takes them over once it is lost
        done = {t.id for t in [*quick, *long, *buffered]}
        await wait_until(lambda: set(records(raw_redis, namespace, "finished")) == done,
                         timeout=30, what="the second worker ran what the first held")
    finally:
        frozen.signal(signal.SIGCONT)
    # awake, its long handlers return at once (their leases are gone), freeing its slots
    await wait_until(lambda: all(records(raw_redis, namespace, "finished").count(t.id) == 2
                                 for t in long), timeout=20,
                     what="the woken worker's handlers ended")
    # the moment it dealt with what it buffered: it said, for each, that it did not start
    # it, as a slot freed or as it handed its buffer back (no handler had ended for long)
    def not_started() -> int:
        log = frozen.log()
        return log.count("not started: it was taken over") + sum(
            int(n) for n in re.findall(r"(\d+) not started, taken over meanwhile", log))

    await wait_until(lambda: not_started() == 2, what="the woken worker's buffer dealt with")
    started = records(raw_redis, namespace, "started")
    for task in buffered:
        assert started.count(task.id) == 1, frozen.log()


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:  # not listening yet
        return 0, ""


async def test_liveness_holds_and_readiness_fails_while_redis_hangs(
        spawn_worker, private_redis) -> None:
    """CLIENT PAUSE: Redis takes connections and answers nothing. A restart would not help
    the worker, and restarting every pod at once would hit Redis when it comes back."""
    port = free_port()
    spawn_worker("--redis-url", private_redis.url, "--http-port", str(port),
                 "--lease-seconds", "3", **LIVENESS)
    await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/readyz")[0] == 200),
                     timeout=30, what="the worker ready")
    admin = redis.Redis.from_url(private_redis.url)
    admin.execute_command("CLIENT", "PAUSE", 12_000, "ALL")
    try:
        lives: list[int] = []

        async def unready() -> bool:
            lives.append((await asyncio.to_thread(probe, port, "/healthz"))[0])
            status, body = await asyncio.to_thread(probe, port, "/readyz")
            return status == 503 and "Redis has not answered" in body

        await wait_until(unready, timeout=10, interval=0.5, what="readyz 503")
        for _ in range(16):  # past the heartbeat TTL and the lease, within the pause
            lives.append((await asyncio.to_thread(probe, port, "/healthz"))[0])
            await asyncio.sleep(0.5)
        assert set(lives) == {200}
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/readyz")[0] == 200),
                     timeout=20, what="ready again")


async def test_only_real_lease_losses_are_reported(broker: Broker, client, raw_redis,
                                                   namespace, caplog) -> None:
    """The heartbeat thread's extension may reach Redis just after a settle of the same
    attempt: a lease the worker ended itself is no loss. One taken over is."""
    await client.enqueue_many([obsq.Job("t", {"n": n}) for n in range(2)])
    _, fetched = await broker.dequeue("default", 2, "w1", 30)
    ended, taken = fetched.tasks
    claims = Claims()
    for task in fetched.tasks:
        claims.took("default", task.id, task.fence)
    heartbeat = Heartbeat(BlockingKeeping(broker), "w1", dict, claims, interval=0.5, ttl=3,
                    lease_seconds=30, policy_interval=30)
    sent = claims.by_queue()  # what the extension read before the settle
    claims.ending("default", ended.id)  # the worker settles it: the ack reaches Redis first
    assert await broker.ack({"default": [Completion(Attempt(ended.id, ended.fence, "t"), 0,
                                                    b"null", "")]}, "w1")
    raw_redis.hset(f"{namespace}:{{default}}:active", taken.id, f"{taken.fence + 1}:w2")
    lost = await asyncio.to_thread(heartbeat.calls.extend, sent, 30, "w1")
    assert sorted(lost["default"]) == sorted([ended.id, taken.id])  # Redis sees both gone
    with caplog.at_level(logging.WARNING, "obsq"):
        await asyncio.to_thread(heartbeat.extend)
    claims.released("default", ended.id, ended.fence)
    with caplog.at_level(logging.WARNING, "obsq"):
        await asyncio.to_thread(heartbeat.extend)
    heartbeat.calls.close()
    reported = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert reported == [f"lease lost for 1 running task(s) of queue default (taken over "
                        f"after the lease expired): {taken.id}"] * 2
