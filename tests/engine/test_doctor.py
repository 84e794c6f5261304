"""`obsq doctor`: clean after a worker's ordinary run (retries, a route limit, ordering keys,
task groups, cancels), then damage put in by hand, each kind named with exit 1, mended by
`--repair` so that a second run is clean, and the shape of `--json`."""

from __future__ import annotations

import asyncio
import json
import time

from support import wait_until

import obsq
from obsq import Job, chain
from obsq.broker import FlowKeys, GlobalKeys, QueueKeys


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


async def test_records_that_cannot_be_read_are_named_and_set_aside(
        client, obsq_cli, raw_redis, namespace) -> None:
    """Each kind of malformed record a fault-injection run planted, with no worker to meet
    it: doctor names each (it saw none, and stopped on a string where a task hash belongs
    with a traceback), --repair sets each aside as a worker would, and what was set aside
    stays a notice."""
    k = QueueKeys(namespace, "default")
    g = GlobalKeys(namespace)
    await client.enqueue("t", 1)
    raw_redis.set(k.task("in-pending"), "a string")
    raw_redis.lpush(k.pending, "in-pending")
    raw_redis.set(k.task("in-retry"), "a string")
    raw_redis.zadd(k.retry, {"in-retry": 1})
    raw_redis.sadd(k.levels, "x")
    raw_redis.lpush(k.pending + ":x", "stray")
    unbuildable = await client.enqueue("t", 2)
    raw_redis.hset(k.task(unbuildable.id), "opts", '{"retention": "x"}')
    unleased = await client.enqueue("t", 3)
    raw_redis.lrem(k.pending, 0, unleased.id)
    raw_redis.hset(k.active, unleased.id, "5:a-worker-gone")
    malformed = await client.enqueue(chain(Job("t", 4), Job("t", 5)))
    raw_redis.hset(FlowKeys(namespace, malformed.id).flow, "left:1", "x")
    deleted = await client.enqueue(chain(Job("t", 6), Job("t", 7)))
    raw_redis.delete(FlowKeys(namespace, deleted.id).flow)
    raw_redis.zadd(g.flows, {b"\xff not a flow id": 1})

    code, out = await obsq_cli("doctor")
    assert code == 1 and "Traceback" not in out, out
    lines = out.splitlines()
    for expected in (
            "default: records in pending that are not task hashes (a worker sets them aside): "
            "1 (e.g. in-pending=string)",
            "default: records in retry that are not task hashes (a worker sets them aside): 1 "
            "(e.g. in-retry=string)",
            "default: priorities named in levels that are not 1 to 9 (each fetch set them "
            "aside; before, every fetch failed): 1 (e.g. x)",
            "default: pending tasks whose stored options a worker cannot read (it ends them "
            f"dead unrun): 1 (e.g. {unbuildable.id}: stored option 'retention' is 'x', not a "
            "number of seconds)",
            "default: attempts in active without a lease, of workers that are gone: 1 "
            f"(e.g. {unleased.id})"):
        assert expected in lines, out
    [flows] = [line for line in lines if line.startswith("flows: flows that cannot be moved")]
    assert flows.startswith("flows: flows that cannot be moved on (their later steps never "
                            "run): 3"), flows
    assert f"{malformed.id}: field left:1" in out and "not a flow id" in out, out
    assert f"{deleted.id}: its record is gone though it had not ended (deleted outside obsq)" \
        in out, out

    code, out = await obsq_cli("doctor", "--repair")
    assert code == 0, out
    for expected in ("repaired default: set 1 record(s) that are not task hashes aside from "
                     f"{k.pending} in the queue's junk",
                     "repaired default: set the pending lists of priorities ['x'] aside in the "
                     "queue's junk",
                     "repaired default: ended 1 task(s) whose stored options cannot be read "
                     "dead, as a worker does",
                     "repaired default: took back 1 attempt(s) without a lease to pending, as "
                     "the recoverer does",
                     "repaired flows: set 3 flow(s) that cannot be moved on aside"):
        assert expected in out, out
    assert "notice: default: 3 record(s) set aside in the queue's junk" in out, out
    assert "notice: flows: 3 flow(s) set aside" in out, out
    assert {n.decode() for n in raw_redis.hkeys(k.junk)} == {"t:in-pending", "t:in-retry",
                                                             "pending:x"}
    assert raw_redis.get(k.task("in-pending")) == b"a string"  # kept to be looked at
    dead = await client.info(unbuildable.id)
    assert dead.state == "dead" and "retention" in dead.error, dead
    assert raw_redis.lrange(k.pending, 0, -1)[-1] == unleased.id.encode()  # first in line
    assert not raw_redis.hexists(k.active, unleased.id)
    code, out = await obsq_cli("doctor")
    assert code == 0 and "no problems, 3 notice(s)" in out, out  # and no worker serves
    code, out = await obsq_cli("doctor", "--strict")
    assert code == 1, out


async def test_a_worker_whose_fetch_loop_stands_still_is_named(
        start_worker, obsq_cli, monkeypatch) -> None:
    """Its heartbeat goes on from its own thread while its fetch loop hangs in a call that
    never returns: doctor said "no problems"."""
    monkeypatch.setattr("obsq.ops.doctor_namespace.STALL_LIMIT", 1.0)
    worker = await start_worker()

    async def hangs(*args: object, **kwargs: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(worker.broker, "wait_and_dequeue", hangs)
    monkeypatch.setattr(worker.broker, "dequeue", hangs)
    await wait_until(lambda: _stalled(worker.broker, "fetch_loop"), timeout=10,
                     what="its heartbeat says the fetch loop stands still")
    code, out = await obsq_cli("doctor")
    assert code == 1, out
    assert (f"workers: live workers whose event loop or fetch loop stands still (they serve "
            f"nothing): 1 (e.g. {worker.id} (fetch loop still for") in out, out


async def test_a_worker_whose_event_loop_is_blocked_is_named(
        client, broker, spawn_worker, obsq_cli, monkeypatch) -> None:
    """A handler blocking the event loop (a sync call in an async def): the heartbeat
    thread keeps the worker alive, and doctor names it while the loop stands still."""
    monkeypatch.setattr("obsq.ops.doctor_namespace.STALL_LIMIT", 1.0)
    spawn_worker()
    await wait_until(lambda: broker.workers(), timeout=20, what="the worker started")
    await client.enqueue("block", {"seconds": 8})
    await wait_until(lambda: _stalled(broker, "event_loop"), timeout=10,
                     what="its heartbeat says the event loop stands still")
    code, out = await obsq_cli("doctor")
    assert code == 1 and "(event loop still for" in out, out


async def _stalled(broker, loop: str) -> bool:
    return any((w.get("stalled") or {}).get(loop, 0) >= 1.5 for w in await broker.workers())
