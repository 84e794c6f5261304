"""Flows survive killed workers: several worker processes run chains and chords, one is
SIGKILLed halfway and another at three quarters, and every flow still ends with the right
result, no step lost and none run again but those a killed worker held. Each moment a kill
can fall on is also taken apart: a step's end waits in its queue's flow inbox (no expiry)
until recorded; recording it again launches nothing twice; a producer that died before
enqueueing a flow's first steps leaves them to the sweep."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal

from support import wait_until

import obsq
from obsq import Job, chain, chord
from obsq.producer.flow_steps import launch, record_ends

from .helpers import record_key

FLOW_APP = "tests.engine.flow_apps:app"


def _step(n: int, sleep: float = 0.05) -> Job:
    return Job("flow:add", {"n": n, "sleep": sleep})


def _records(raw_redis, namespace: str, name: str) -> list[tuple[str, str]]:
    return [tuple(v.decode().split()) for v in raw_redis.lrange(record_key(namespace, name),
                                                                0, -1)]


async def test_flows_survive_a_worker_killed_halfway(client, raw_redis, namespace,
                                                     spawn_worker, obsq_cli) -> None:
    workers = [spawn_worker(app=FLOW_APP, concurrency=4) for _ in range(3)]
    flows = [await client.enqueue(chain(*(_step(n) for n in range(1, 7)))) for _ in range(4)]
    flows += [await client.enqueue(chord([_step(n, 0.02) for n in range(40)], _step(1000)))
              for _ in range(3)]
    flows.append(await client.enqueue(chain(
        _step(1), chord([chain(_step(2), _step(3)), _step(4)], _step(5)), _step(6))))
    expected = [21] * 4 + [sum(range(40)) + 1000] * 3 + [(1 + 2 + 3) + (1 + 4) + 5 + 6]
    steps = sum(len(f.steps) for f in flows)
    killed = []
    for share, doomed in ((2, workers[0]), (4 / 3, workers[1])):  # at 1/2, then at 3/4
        await wait_until(lambda share=share: len(_records(
            raw_redis, namespace, "flow-finished")) >= steps / share, timeout=60,
            what="steps done")
        doomed.signal(signal.SIGKILL)
        killed.append(str(doomed.pid))
        spawn_worker(app=FLOW_APP, concurrency=4)
    results = [await client.result(f, timeout=90) for f in flows]
    assert results == expected
    started = collections.defaultdict(list)
    for task_id, pid in _records(raw_redis, namespace, "flow-started"):
        started[task_id].append(pid)
    assert set(started) == {s.id for f in flows for s in f.steps}  # none lost
    for task_id, pids in started.items():  # again only what a killed worker held
        assert all(pid in killed for pid in pids[:-1]), (task_id, pids)
    for flow in flows:
        assert (await client.info(flow)).state == "completed"
    code, output = await obsq_cli("doctor")
    assert code == 0, output


async def test_a_steps_end_waits_in_its_queues_flow_inbox_until_recorded(
        app, client, broker, raw_redis, namespace, start_worker) -> None:
    """The worker that ended the step is gone before its flow heard of it: the end stays in
    the inbox, with no expiry, and whoever reads it next moves the flow on, once."""
    @app.task("one")
    async def one(task: obsq.Task):
        return 1

    inbox = f"{namespace}:{{default}}:inbox:~flows"
    worker = await start_worker()
    worker._flows.ended = lambda task: None  # as if killed before its FlowLoop heard
    await worker._flows.stop()
    flow = await client.enqueue(chain(Job("one"), Job("one"), Job("one")))
    await wait_until(lambda: raw_redis.llen(inbox) == 1, timeout=10, what="the first end")
    assert raw_redis.ttl(inbox) == -1
    [entry] = raw_redis.lrange(inbox, 0, -1)
    assert await record_ends(broker, [entry]) == []  # the flow goes on
    assert await record_ends(broker, [entry]) == []  # read again: nothing twice
    await broker.drop_flow_ends("default", [entry])
    await wait_until(lambda: raw_redis.llen(inbox) == 1, timeout=10, what="the second end")
    [entry] = raw_redis.lrange(inbox, 0, -1)
    # killed after recording it, before enqueueing what it completes: the step stays
    # launching, and reading the entry again launches it
    await broker.flow_steps_ended(flow.id, [(1, "completed", b"1")])
    assert (await client.info(flow)).steps[2].state == "launching"
    await record_ends(broker, [entry])
    state, launches = await broker.flow_launching(flow.id)
    assert (state, launches) == ("running", [])
    await launch(broker, flow.id, [(2, b"")])  # and a launch done twice enqueues nothing
    worker._flows.start()
    assert await client.result(flow, timeout=10) == 1
    assert raw_redis.llen(f"{namespace}:{{default}}:pending") == 0


async def test_a_producer_killed_before_enqueueing_the_first_steps(
        app, client, broker, raw_redis, namespace, start_worker, monkeypatch) -> None:
    ran: list[str] = []

    @app.task("one")
    async def one(task: obsq.Task):
        ran.append(task.id)
        return 1

    async def killed(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr("obsq.producer.flow_client.launch", killed)
    with contextlib.suppress(asyncio.CancelledError):
        await client.enqueue(chord([Job("one"), Job("one")], Job("one")))
    monkeypatch.undo()
    [raw_id] = raw_redis.zrange(f"{namespace}:{{flows}}:index", 0, -1)
    flow = obsq.FlowInfo(raw_id.decode(), "running", [], 2)
    assert [s.state for s in (await client.info(flow)).steps] == ["launching"] * 2 + [
        "waiting"]
    await broker.index_flows("set", 0, flow.id)  # due now instead of FLOW_LAUNCH_GRACE on
    await start_worker()
    assert await client.result(flow, timeout=10) == 1
    assert sorted(ran[:2]) == [f"{flow.id}.0", f"{flow.id}.1"] and ran[2:] == [f"{flow.id}.2"]


async def test_task_previous_reaches_a_child_process(client, spawn_worker) -> None:
    worker = spawn_worker("--pool", "process", app=FLOW_APP, concurrency=2)
    flow = await client.enqueue(chord([_step(1), Job("flow:plain")], Job("flow:plain"),
                                      with_failures=True))
    first, callback = await client.result(flow, timeout=60)
    assert first == 1 and callback[0] is None and callback[1] != worker.pid  # in a child
