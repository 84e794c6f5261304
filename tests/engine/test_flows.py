"""Workflows on a real Redis: a chain runs its steps in order, each reading the one before
as `task.previous`; a chord's callback runs once, after all its members, with their results
in order; flows nest; a dead step fails its flow (or, with `with_failures`, reaches the
callback); a flow is cancelled, deleted, and its keys go after its retention."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

import obsq
from obsq import Job, chain, chord
from obsq.broker import FlowKeys, GlobalKeys, QueueKeys

from .helpers import collides, queue_key_names


def _add_handlers(app: obsq.App, ran: list[tuple[str, object, object]]) -> None:
    @app.task("add", max_retry=0)
    async def add(task: obsq.Task):
        ran.append(("add", task.payload, task.previous))
        return (task.previous or 0) + task.payload

    @app.task("total", max_retry=0)
    def total(task: obsq.Task):  # a plain handler: task.previous reaches threads too
        ran.append(("total", task.payload, task.previous))
        return sum(p if isinstance(p, int) else 1000 for p in task.previous)

    @app.task("boom", max_retry=1, retry_delay=0)
    async def boom(task: obsq.Task):
        ran.append(("boom", task.payload, task.retry_count))
        raise RuntimeError(f"boom {task.payload}")


async def test_a_chain_runs_in_order_each_step_reading_the_one_before(
        app, client, start_worker) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    ends: list[str] = []
    app.on_flow_end(ends.append)
    await start_worker()
    flow = await client.enqueue(chain(Job("add", 1), Job("add", 10), Job("add", 100)))
    assert isinstance(flow, obsq.FlowInfo)
    assert await client.result(flow, timeout=20) == 111
    assert ran == [("add", 1, None), ("add", 10, 1), ("add", 100, 11)]
    info = await client.info(flow)
    assert info.state == "completed" and info.result == 111
    assert [s.state for s in info.steps] == ["completed"] * 3
    assert [s.waits_for for s in info.steps] == [[], [0], [1]]
    assert ends == ["completed"]  # told once (obsq_flows_ended_total)


async def test_a_chord_callback_runs_once_with_the_results_in_order(
        app, client, start_worker) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker(concurrency=20)
    flow = await client.enqueue(chord([Job("add", n) for n in range(30)], Job("total", "t")))
    assert await client.result(flow, timeout=30) == sum(range(30))
    callbacks = [r for r in ran if r[0] == "total"]
    assert callbacks == [("total", "t", list(range(30)))]


async def test_nested_flows(app, client, start_worker) -> None:
    """A chain whose step is a chord, whose member is a chain."""
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker(concurrency=10)
    flow = await client.enqueue(chain(
        Job("add", 1),
        chord([chain(Job("add", 2), Job("add", 3)), Job("add", 4)], Job("total", "cb")),
        Job("add", 1000)))
    # 1; members: (1+2)+3 = 6 and 1+4 = 5; callback 11; then 1011
    assert await client.result(flow, timeout=30) == 1011
    assert ("total", "cb", [6, 5]) in ran
    assert ran[-1] == ("add", 1000, 11)



async def test_a_dead_step_fails_its_flow_and_later_steps_never_run(
        app, client, start_worker) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    ends: list[str] = []
    app.on_flow_end(ends.append)
    await start_worker()
    flow = await client.enqueue(chain(Job("add", 1), Job("boom", "x"), Job("add", 5)))
    with pytest.raises(obsq.FlowFailed) as failed:
        await client.result(flow, timeout=20)
    assert failed.value.task_id == flow.steps[1].id
    assert "boom x" in str(failed.value.error)
    info = await client.info(flow)
    assert (info.state, info.failed_step) == ("failed", 1)
    assert "RuntimeError: boom x" in info.error
    assert [s.state for s in info.steps] == ["completed", "dead", "waiting"]
    assert [r[2] for r in ran if r[0] == "boom"] == [0, 1]  # the step's own retries
    assert not [r for r in ran if r[:2] == ("add", 5)]
    assert ends == ["failed"]


async def test_a_chord_with_failures_runs_its_callback_with_them(
        app, client, start_worker) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker()
    flow = await client.enqueue(chord([Job("add", 1), Job("boom", "m"), Job("add", 2)],
                                      Job("total", "cb"), with_failures=True))
    assert await client.result(flow, timeout=20) == 1003
    [(_, _, previous)] = [r for r in ran if r[0] == "total"]
    assert previous[0] == 1 and previous[2] == 2
    assert isinstance(previous[1], obsq.StepFailure)
    assert previous[1].task_id == flow.steps[1].id and "boom m" in previous[1].error
    without = await client.enqueue(chord([Job("boom", "n")], Job("total", "never")))
    with pytest.raises(obsq.FlowFailed):
        await client.result(without, timeout=20)
    assert not [r for r in ran if r[1] == "never"]


async def test_cancel_and_delete_a_flow(app, client, start_worker, raw_redis,
                                        namespace) -> None:
    started = asyncio.Event()

    @app.task("wait")
    async def wait(task: obsq.Task):
        started.set()
        await asyncio.sleep(60)

    @app.task("after")
    async def after(task: obsq.Task):
        raise AssertionError("a cancelled flow's later step ran")

    ends: list[str] = []
    app.on_flow_end(ends.append)
    await start_worker()
    flow = await client.enqueue(chain(Job("wait"), Job("after")))
    with pytest.raises(obsq.TaskRunning):
        await client.delete(flow)
    await asyncio.wait_for(started.wait(), 10)
    assert await client.cancel(flow) == "running"
    with pytest.raises(obsq.FlowCancelled, match=f"flow {flow.id} was cancelled") as caught:
        await client.result(flow, timeout=5)
    assert isinstance(caught.value, obsq.FlowFailed | obsq.TaskCancelled)  # caught as either
    assert [s.state for s in (await client.info(flow)).steps][1:] == ["cancelled"]  # never runs
    await wait_until(lambda: raw_redis.hget(f"{namespace}:{{default}}:t:{flow.steps[0].id}",
                                            "state") == b"cancelled", what="step cancelled")
    assert (await client.info(flow)).state == "cancelled"
    await wait_until(lambda: ends == ["cancelled"], what="the cancelled flow told ended")
    assert await client.delete(flow) == "cancelled"
    with pytest.raises(obsq.TaskNotFound):
        await client.info(flow)
    keys = FlowKeys(namespace, flow.id)
    assert not raw_redis.exists(keys.flow, keys.results, keys.launching)
    assert not raw_redis.exists(f"{namespace}:{{default}}:t:{flow.steps[0].id}")


async def test_an_ended_flow_keeps_its_keys_for_its_retention_only(
        app, client, start_worker, raw_redis, namespace) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker()
    flow = await client.enqueue(chord([Job("add", n) for n in range(50)], Job("total", "t"),
                                      retention=1))
    assert await client.result(flow, timeout=30) == sum(range(50))
    keys = FlowKeys(namespace, flow.id)
    assert 0 < raw_redis.pttl(keys.flow) <= 1000 and raw_redis.pttl(keys.results) <= 1000
    await wait_until(lambda: not raw_redis.exists(keys.flow, keys.results), timeout=10,
                     what="the flow's keys gone")
    # no step's task is left behind, nor an end waiting in a flow inbox
    assert not raw_redis.keys(f"{namespace}:{{default}}:t:*")
    assert not raw_redis.llen(f"{namespace}:{{default}}:inbox:~flows")


def test_a_flow_checks_its_steps() -> None:
    with pytest.raises(ValueError):
        chain()
    with pytest.raises(ValueError):
        chord([], Job("t"))
    with pytest.raises(TypeError):
        chain("t")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        chain(Job("t", task_id="mine"))
    with pytest.raises(ValueError):
        chord([Job("t", unique_for=60)], Job("t"))


def test_the_flows_keys_do_not_collide_with_a_queue_named_flows() -> None:
    """A queue named "flows" shares the index's prefix: its names must differ."""
    queue, flows = QueueKeys("ns", "flows"), GlobalKeys("ns")
    mine = [key[len(queue.prefix):] for key in (flows.flows, flows.flow_look, flows.flow_junk)
            if key.startswith(queue.prefix)]
    assert len(mine) == 3
    taken = queue_key_names(skip_scripts=("flow_index.lua",))
    assert [name for name in mine if collides(name, taken)] == []


async def test_the_inspector_and_the_sync_client_see_flows(
        app, redis_url, namespace, start_worker, inspector) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker()

    def produce() -> tuple[obsq.FlowInfo, object]:
        with obsq.SyncClient(redis_url, app=app) as sync_client:
            flow = sync_client.enqueue(chain(Job("add", 2), Job("add", 3)))
            result = sync_client.result(flow, timeout=20)
            assert sync_client.info(flow).state == "completed"
            return flow, result

    flow, result = await asyncio.to_thread(produce)
    assert result == 5
    total, flows = await inspector.flows()
    assert total == 1 and [f.id for f in flows] == [flow.id]
    # a listing reads no steps (a chord of 10,000 has as many), only their counts
    assert (flows[0].state, flows[0].steps, flows[0].step_count, flows[0].steps_completed,
            flows[0].result) == ("completed", [], 2, 2, 5)
    assert (await inspector.flow(flow.id)).result == 5


async def test_the_flow_commands(app, client, start_worker, obsq_cli) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker()
    flow = await client.enqueue(chain(Job("add", 1), Job("boom", "c"), Job("add", 2)))
    with pytest.raises(obsq.FlowFailed):
        await client.result(flow, timeout=20)
    code, output = await obsq_cli("flow", flow.id)
    assert code == 0 and "failed" in output and "step 1" in output and "boom c" in output
    assert flow.steps[2].id in output and "waiting" in output
    code, output = await obsq_cli("flows", "--json")
    assert code == 0 and flow.id in output
    code, output = await obsq_cli("flow", "nope")
    assert code == 1 and "no flow" in output
    code, output = await obsq_cli("delete", "--flow", flow.id)
    assert code == 0 and f"deleted flow {flow.id} (it was failed)" in output
    waiting = await client.enqueue(chain(Job("add", 1, queue="idle")))
    code, output = await obsq_cli("cancel", "--flow", waiting.id)
    assert code == 0 and "(it was running)" in output
    assert (await client.info(waiting)).state == "cancelled"


async def test_doctor_checks_flows(app, client, start_worker, raw_redis, namespace,
                                   obsq_cli) -> None:
    ran: list[tuple[str, object, object]] = []
    _add_handlers(app, ran)
    await start_worker()  # serves "default" only
    done = await client.enqueue(chord([Job("add", n) for n in range(5)], Job("total", "t")))
    assert await client.result(done, timeout=20) == 10
    code, output = await obsq_cli("doctor")
    assert code == 0, output
    stuck = await client.enqueue(chain(Job("add", 1, queue="idle"), Job("add", 2)))
    queue = QueueKeys(namespace, "idle")
    raw_redis.lrem(queue.pending, 0, stuck.steps[0].id)  # its task lost behind obsq's back
    raw_redis.delete(queue.task(stuck.steps[0].id))
    code, output = await obsq_cli("doctor")
    assert code == 1 and stuck.steps[0].id in output and "cannot end" in output, output
    code, output = await obsq_cli("doctor", "--repair")
    assert code == 0 and "failing their flow" in output, output
    info = await client.info(stuck)
    assert (info.state, info.failed_step) == ("failed", 0) and "gone" in info.error


async def test_result_waits_for_the_running_step_instead_of_polling(
        app, client, start_worker, monkeypatch) -> None:
    @app.task("slow")
    async def slow(task: obsq.Task):
        await asyncio.sleep(1)
        return (task.previous or 0) + 1

    await start_worker()
    flow = await client.enqueue(chain(Job("slow"), Job("slow")))
    reads = 0
    flow_state = client.broker.flow_state

    async def counted(flow_id: str):
        nonlocal reads
        reads += 1
        return await flow_state(flow_id)

    monkeypatch.setattr(client.broker, "flow_state", counted)
    assert await client.result(flow, timeout=30) == 2
    # one read per step's end and a few while its flow hears of it, not one per 5-200 ms
    assert reads <= 12, reads


async def test_a_flows_id_stands_for_it_where_a_tasks_does(
        app, client, start_worker, obsq_cli, redis_url) -> None:
    """info, result, cancel and delete take a flow's id (the Client's, the SyncClient's and
    the CLI's task commands); a running member shows as running; a flow's ResultTimeout
    names the flow."""
    held = asyncio.Semaphore(0)

    @app.task("hold")
    async def hold(task: obsq.Task):
        held.release()
        await asyncio.sleep(60)

    await start_worker(concurrency=4)
    stuck = await client.enqueue(chain(Job("hold", queue="idle"), Job("hold")))
    assert [s.queue for s in (await client.info(stuck.id)).steps] == ["idle", "default"]
    with pytest.raises(obsq.ResultTimeout, match=f"flow {stuck.id} did not finish"):
        await client.result(stuck.id, timeout=0.2)
    code, output = await obsq_cli("task", stuck.id)
    assert code == 1 and f"is a flow's id, not a task's: obsq flow {stuck.id}" in output
    code, output = await obsq_cli("cancel", stuck.id)
    assert code == 0 and f"cancelled flow {stuck.id} (it was running)" in output
    code, output = await obsq_cli("delete", stuck.id)
    assert code == 0 and f"deleted flow {stuck.id} (it was cancelled)" in output

    flow = await client.enqueue(chord([Job("hold"), Job("hold")], Job("hold")))
    for _ in range(2):
        await asyncio.wait_for(held.acquire(), 10)
    info = await client.info(flow.id)
    assert [s.state for s in info.steps] == ["running", "running", "waiting"]
    code, output = await obsq_cli("flow", flow.id)
    assert code == 0 and output.count("running") == 3, output  # the flow and two members
    assert await client.cancel(flow.id) == "running"
    with pytest.raises(obsq.FlowFailed):
        await client.result(flow.id, timeout=5)

    def sync_calls() -> tuple[str, str]:
        with obsq.SyncClient(redis_url, app=app) as sync_client:
            return sync_client.info(flow.id).state, sync_client.delete(flow.id)

    assert await asyncio.to_thread(sync_calls) == ("cancelled", "cancelled")
    with pytest.raises(obsq.TaskNotFound, match="no task"):
        await client.info(flow.id)
