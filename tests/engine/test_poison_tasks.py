"""A task that kills its worker process (os._exit, a native crash, an OOM kill) takes the
tasks running beside it down too. They are taken back as suspects, which run alone; only a
loss during a run alone counts against max_recoveries, so the poison ends dead and every
task that merely ran beside it completes."""

from __future__ import annotations

import asyncio
import logging
import time

from support import depth, wait_until

import obsq
from obsq.broker import Broker, QueueKeys

from .helpers import decoded, record_key

INNOCENT = 30


async def test_a_poison_task_takes_no_innocent_task_down_with_it(
        client: obsq.Client, broker: Broker, raw_redis, namespace, spawn_worker) -> None:
    jobs = [obsq.Job("sleep", {"first": 1.0, "then": 0.1}, retention=600)
            for _ in range(INNOCENT)]
    jobs.insert(5, obsq.Job("crash", retention=600))
    started = time.monotonic()
    infos = await client.enqueue_many(jobs)
    poison = infos.pop(5)
    worker = spawn_worker("--processes", "2", "--max-recoveries", "2", concurrency=10)

    async def ended() -> list[str] | None:
        states = [(await client.info(i.id)).state for i in [poison, *infos]]
        return states if all(s in ("completed", "dead") for s in states) else None

    states = await wait_until(ended, timeout=300, interval=0.5, what="every task ended")
    elapsed = time.monotonic() - started
    assert states[0] == "dead"
    assert states[1:].count("dead") == 0, f"{states[1:].count('dead')} innocent tasks dead"
    dead = await client.info(poison.id)
    assert dead.error == ("lost its worker 3 times while it ran alone (max_recoveries 2): "
                          "the task kills its worker")
    assert (await depth(broker))["dead"] == 1
    runs = int(raw_redis.get(record_key(namespace, f"attempts:{poison.id}")))
    assert runs == 4, "one run beside others, then three alone"
    innocent_runs = len(decoded(raw_redis.lrange(record_key(namespace, "started"), 0, -1))) \
        - runs
    crashes = worker.log().count("exited with")
    print(f"poison: {runs} runs, {crashes} worker crashes; {INNOCENT} innocent tasks: "
          f"{innocent_runs} runs, all completed; {elapsed:.1f} s in all")


def _make_suspect(raw_redis, namespace: str, task_id: str) -> None:
    """As the recoverer leaves a task that ran beside others on a lost worker."""
    raw_redis.hset(QueueKeys(namespace, "default").task(task_id), "sus", "1")


async def test_a_suspect_runs_with_no_other_task_beside_it(
        app, client, raw_redis, namespace, start_worker) -> None:
    running: set[str] = set()
    beside: list[set[str]] = []

    @app.task("job")
    async def job(task: obsq.Task) -> None:
        running.add(task.id)
        if task.payload == "suspect":
            beside.append(running - {task.id})
        await asyncio.sleep(0.2)
        if task.payload == "suspect":
            beside.append(running - {task.id})
        running.discard(task.id)

    infos = await client.enqueue_many([obsq.Job("job", i, retention=60) for i in range(10)])
    suspect = await client.enqueue("job", "suspect", retention=60)
    infos += await client.enqueue_many([obsq.Job("job", i, retention=60) for i in range(10)])
    _make_suspect(raw_redis, namespace, suspect.id)
    await start_worker(concurrency=10)
    for info in [*infos, suspect]:
        await client.result(info, timeout=30)
    assert beside == [set(), set()], "other tasks ran beside the suspect"
    # its attempt was recorded as run alone: a loss of it would count
    assert raw_redis.hget(QueueKeys(namespace, "default").task(suspect.id), "iso")


async def test_a_suspect_runs_beside_a_hung_task_after_waiting_for_it(
        app, client, raw_redis, namespace, start_worker, caplog) -> None:
    caplog.set_level(logging.INFO, logger="obsq")
    release = asyncio.Event()

    @app.task("hang")
    async def hang(task: obsq.Task) -> None:
        await release.wait()

    @app.task("job")
    async def job(task: obsq.Task) -> str:
        return "done"

    hung = await client.enqueue("hang")
    suspect = await client.enqueue("job", retention=60)
    _make_suspect(raw_redis, namespace, suspect.id)
    await start_worker(concurrency=4)
    # the hung task never ends: after SUSPECT_WAIT the suspect runs beside it, unmarked
    assert await client.result(suspect, timeout=30) == "done"
    assert (await client.info(hung.id)).state == "active"
    assert not raw_redis.hget(QueueKeys(namespace, "default").task(suspect.id), "iso")
    assert any("runs beside 1 other task(s)" in r.getMessage() for r in caplog.records)
    release.set()


async def test_a_fetch_takes_one_suspect_and_leaves_the_others_first_in_line(
        client, broker, raw_redis, namespace) -> None:
    """Suspects run one at a time in their worker: the others of a batch go to the head of
    the queue, for other workers."""
    infos = await client.enqueue_many([obsq.Job("job", i) for i in range(4)])
    for info in infos[:3]:
        _make_suspect(raw_redis, namespace, info.id)
    _, fetched = await broker.dequeue("default", 10, "w1", lease_seconds=30)
    assert [(t.id, t.suspect) for t in fetched.tasks] == [(infos[0].id, True),
                                                          (infos[3].id, False)]
    _, fetched = await broker.dequeue("default", 10, "w2", lease_seconds=30)
    assert sorted(t.id for t in fetched.tasks) in ([infos[1].id], [infos[2].id])
    assert (await depth(broker))["pending"] == 1


async def test_a_suspect_that_ran_to_its_end_is_no_longer_one(
        app, client, raw_redis, namespace, start_worker) -> None:
    """Its run ended by itself (a failure retried here), so it did not kill its worker: the
    next attempt, and one an operator requeues, runs like any other."""
    suspected: list[bool] = []

    @app.task("flaky", retry_delay=0)
    async def flaky(task: obsq.Task) -> None:
        suspected.append(task._attempt.suspect)
        if len(suspected) == 1:
            raise ValueError("not yet")

    info = await client.enqueue("flaky")
    _make_suspect(raw_redis, namespace, info.id)
    await start_worker()
    await wait_until(lambda: len(suspected) == 2, what="the retry ran")
    assert suspected == [True, False]
