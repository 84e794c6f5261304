"""`obsq doctor`: clean after a worker's ordinary run (retries, a route limit, ordering keys,
task groups, cancels), then damage put in by hand, each kind named with exit 1, mended by
`--repair` so that a second run is clean, and the shape of `--json`."""

from __future__ import annotations

import asyncio
import json
import time

from support import wait_until

import obsq


def _app_tasks(app: obsq.App, seen: list[int]) -> None:
    @app.task("flaky", retry_delay=0.05)
    async def flaky(task: obsq.Task):
        if task.retry_count < 2:
            raise RuntimeError("not yet")
        return "ok"

    @app.task("report:", concurrency=1)
    async def report(task: obsq.Task):
        await asyncio.sleep(0.02)

    @app.task("ledger")
    async def ledger(task: obsq.Task):
        seen.append(task.payload)

    @app.task("slow")
    async def slow(task: obsq.Task):
        await asyncio.sleep(30)

    @app.task("sum")
    async def total(task: obsq.Task):
        return sum(task.payload)

    app.aggregate("add", lambda group, tasks: ("sum", [t.payload for t in tasks]),
                  max_size=3, max_delay=0.2, grace_period=0.1)


async def _normal_run(app, client, start_worker) -> obsq.Worker:
    seen: list[int] = []
    _app_tasks(app, seen)
    worker = await start_worker(concurrency=8)
    ends = [await client.enqueue("flaky", retention=60)]
    ends += [await client.enqueue("report:pdf", n, retention=60) for n in range(6)]
    ends += [await client.enqueue("ledger", n, ordering_key=f"acct-{n % 2}", retention=60)
             for n in range(6)]
    grouped = [await client.enqueue("add", n, group="g") for n in range(7)]
    later = await client.enqueue("ledger", 99, delay=3600)
    assert await client.cancel(later.id) == "cancelled"
    slow = await client.enqueue("slow")
    await wait_until(lambda: _state(client, slow.id, "active"))
    assert await client.cancel(slow.id) == "running"
    for info in ends:
        await client.result(info, timeout=20)
    await wait_until(lambda: _gone(client, grouped))
    await wait_until(lambda: _state(client, slow.id, "cancelled"))
    assert sorted(seen)[:6] == list(range(6))
    return worker


async def test_clean_after_a_normal_run(app, client, start_worker, obsq_cli) -> None:
    await _normal_run(app, client, start_worker)
    code, out = await obsq_cli("doctor")
    assert code == 0, out
    assert "no problems" in out


async def test_damage_is_named_then_repaired(app, client, start_worker, obsq_cli, raw_redis,
                                             namespace) -> None:
    stale = await client.enqueue("ledger", 1000, retention=60)
    worker = await _normal_run(app, client, start_worker)
    await client.result(stale, timeout=20)
    worker.stop()  # its sweeps would mend some of the damage
    await wait_until(lambda: not raw_redis.exists(f"{namespace}:worker:{worker.id}"),
                     what="the worker stopped")
    prefix = f"{namespace}:{{default}}:"
    # a counter off, an id in pending with no task, held ids with no task (in a sorted set
    # of held tasks, and in an earlier version's list of them)
    raw_redis.incrby(prefix + "waiting", 3)
    raw_redis.incrby(prefix + "grouped", 2)
    raw_redis.lpush(prefix + "pending", "ghost-1")
    raw_redis.zadd(prefix + "retry", {"ghost-2": 1})
    raw_redis.lpush(prefix + "held:report:", "ghost-3")
    raw_redis.sadd(prefix + "holding", "report:")
    raw_redis.zadd(prefix + "hold:report:", {"0000000000000001:ghost-5": 1})
    raw_redis.sadd(prefix + "holds", "report:")
    # a task hash deleted under an active lease of a worker that is gone
    raw_redis.zadd(prefix + "lease", {"ghost-4": 1})
    raw_redis.hset(prefix + "active", "ghost-4", "7:dead-worker")
    # a task whose hash says dead in the retry set; an attempt of a lost worker long expired
    raw_redis.zadd(prefix + "retry", {stale.id: 1})
    # the first task of an ordering key gone, the next waiting behind it
    first = await client.enqueue("ledger", 1, ordering_key="acct:9")
    second = await client.enqueue("ledger", 2, ordering_key="acct:9")
    raw_redis.lrem(prefix + "pending", 0, first.id)
    raw_redis.delete(prefix + "t:" + first.id)
    orphan = await client.enqueue("ledger", queue="idle")
    idle = f"{namespace}:{{idle}}:"
    raw_redis.lrem(idle + "pending", 0, orphan.id)
    raw_redis.zadd(idle + "lease", {orphan.id: 1})
    raw_redis.hset(idle + "active", orphan.id, "3:lost-worker")

    code, out = await obsq_cli("doctor")
    assert code == 1, out
    lines = out.splitlines()
    for expected in ("default: counter waiting is 4, the held and key-waiting tasks are 3: 1",
                     f"default: ids with no task in ord:acct:9: 1 (e.g. {first.id})",
                     "default: counter grouped is 2, the tasks in groups and batches are 0: 2",
                     "default: ids with no task in pending: 1 (e.g. ghost-1)",
                     "default: ids with no task in retry: 1 (e.g. ghost-2)",
                     "default: ids with no task in held:report:: 1 (e.g. ghost-3)",
                     "default: ids with no task in hold:report:: 1 "
                     "(e.g. 0000000000000001:ghost-5)",
                     "default: ids with no task in active: 1 (e.g. ghost-4)",
                     f"default: tasks in retry whose state names another place: 1 "
                     f"(e.g. {stale.id}=completed)",
                     "idle: active attempts of lost workers, their lease ended over 60s "
                     f"ago: 1 (e.g. {orphan.id})"):
        assert expected in lines, out

    code, out = await obsq_cli("doctor", "--json")
    assert code == 1
    report = json.loads(out)
    assert set(report) == {"namespace", "queues", "clean", "problems", "repairs", "notes",
                           "notices"}
    assert report["clean"] is False and report["namespace"] == namespace
    assert sorted(report["queues"]) == ["default", "idle"]
    assert {"queue": "default", "what": "ids with no task in pending", "count": 1,
            "examples": ["ghost-1"]} in report["problems"]

    code, out = await obsq_cli("doctor", "--repair")
    assert "repaired default: dropped 1 id(s) with no task from " + prefix + "pending" in out
    assert "repaired idle: took back 1 orphaned attempt(s)" in out
    assert "repaired default: set waiting from 1 to 0" in out
    assert "repaired default: set grouped from 2 to 0" in out
    # what cannot be mended safely stays named
    assert code == 1 and out.strip().splitlines()[-1].startswith(
        "default: tasks in retry whose state names another place"), out
    raw_redis.zrem(prefix + "retry", stale.id)
    code, out = await obsq_cli("doctor")
    assert code == 0, out
    assert raw_redis.lrange(idle + "pending", 0, -1) == [orphan.id.encode()]
    assert raw_redis.lrange(prefix + "pending", 0, -1) == [second.id.encode()]


async def _state(client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def _gone(client, infos) -> bool:
    for info in infos:
        try:
            await client.info(info.id)
        except obsq.TaskNotFound:
            continue
        return False
    return True


async def test_what_the_engine_mends_itself_is_information(client, obsq_cli, raw_redis,
                                                           namespace) -> None:
    """A fire claimed by a scheduler that died and a lapsed subscription: the next
    scheduler and the next publish mend them, so they are shown, and the exit is 0."""
    await client.enqueue("t", 1)
    raw_redis.hset(f"{namespace}:{{schedules}}:firing", "nightly", "1700000000000 {}")
    raw_redis.sadd(f"{namespace}:{{events}}:subscribed", "order.paid")
    raw_redis.zadd(f"{namespace}:{{events}}:sub:order.paid", {"mailer default": 1})
    code, out = await obsq_cli("doctor")
    assert code == 0, out
    assert "info: schedule nightly: fire at 1700000000000 ms claimed and not confirmed" in out
    assert "info: event order.paid: 1 lapsed subscription(s)" in out
    assert "1 queue(s), no problems" in out
    code, out = await obsq_cli("doctor", "--json")
    assert code == 0 and json.loads(out)["clean"] is True
    assert len(json.loads(out)["notes"]) == 2


async def test_repair_counts_a_recovery_against_the_workers_max_recoveries(
        client, raw_redis, namespace, obsq_cli, monkeypatch) -> None:
    """An orphaned attempt of a task that ran alone is taken back as the recoverer takes it,
    with the max_recoveries the workers read (OBSQ_MAX_RECOVERIES), not the default."""
    orphan = await client.enqueue("nobody-runs-this", queue="idle")
    idle = f"{namespace}:{{idle}}:"
    raw_redis.lrem(idle + "pending", 0, orphan.id)
    raw_redis.zadd(idle + "lease", {orphan.id: 1})
    raw_redis.hset(idle + "active", orphan.id, "3:lost-worker")
    raw_redis.hset(idle + "t:" + orphan.id, "iso", "3")  # its attempt ran alone
    monkeypatch.setenv("OBSQ_MAX_RECOVERIES", "0")
    code, out = await obsq_cli("doctor", "--repair")
    assert "repaired idle: took back 1 orphaned attempt(s)" in out, out
    assert code == 0, out
    assert (await client.info(orphan.id)).state == "dead"


async def test_work_no_worker_takes_is_a_notice_and_fails_only_strict(
        app, client, client_without_app, start_worker, obsq_cli) -> None:
    """Every invariant holds, yet work waits: a queue no live worker serves, and a type no
    worker handles (enqueued without the App), handed on. Both are notices: exit 0, or 1
    with --strict."""
    @app.task("known")
    async def known(task: obsq.Task):
        pass

    await start_worker()  # serves the default queue, without a handler for "ghost"
    await client.enqueue("known", queue="nobody")
    ghost = await client_without_app.enqueue("ghost")
    await wait_until(lambda: _handed_on(client, ghost.id))
    code, out = await obsq_cli("doctor")
    assert code == 0, out
    assert "notice: nobody: 1 pending task(s), the oldest waiting" in out
    assert "no live worker serves the queue" in out
    assert "notice: default: 1 task(s) handed on by workers with no handler for their " \
           "type: ghost (1)" in out
    assert "no problems, 2 notice(s)" in out
    code, out = await obsq_cli("doctor", "--json")
    assert code == 0 and len(json.loads(out)["notices"]) == 2, out
    code, out = await obsq_cli("doctor", "--strict")
    assert code == 1, out


async def _handed_on(client, task_id: str) -> bool:
    info = await client.info(task_id)
    return info.state == "scheduled" and "UnknownTaskType" in (info.error or "")


async def test_a_completed_id_past_its_retention_without_its_task_is_no_damage(
        client, obsq_cli, raw_redis, namespace) -> None:
    """A completed task's hash expires a minute after its retention; the janitor takes the
    id out of `completed` only while a worker runs. Past its retention, no damage; before,
    an id without its task is."""
    await client.enqueue("noop", queue="default")  # the queue exists
    completed = f"{namespace}:{{default}}:completed"
    raw_redis.zadd(completed, {"expired-long-ago": 1})
    code, out = await obsq_cli("doctor")
    assert code == 0 and "expired-long-ago" not in out, out
    raw_redis.zadd(completed, {"kept-for-an-hour": (time.time() + 3600) * 1000})
    code, out = await obsq_cli("doctor")
    assert code == 1 and "kept-for-an-hour" in out, out
