"""Task groups in one worker: a full group, the grace period, bad input refused before
anything is written, a failing aggregator that loses nothing, a cancelled grouped task."""

from __future__ import annotations

import pytest
from support import depth, wait_until

import obsq
from obsq.broker import Broker
from obsq.errors import BrokerError


async def test_a_full_group_becomes_one_task(app, client, start_worker, broker) -> None:
    seen: list[tuple[str, list]] = []

    @app.task("ingest")
    async def ingest(task: obsq.Task) -> None:
        raise AssertionError("grouped tasks never run themselves")

    @app.task("ingest:batch")
    async def batch(task: obsq.Task) -> None:
        seen.append((task.headers["obsq-group"], task.payload))

    app.aggregate("ingest", lambda group, tasks: ("ingest:batch", [t.payload for t in tasks]),
                  max_size=3, max_delay=30, grace_period=30)
    infos = [await client.enqueue("ingest", i, group="g") for i in range(7)]
    assert {i.state for i in infos} == {"aggregating"}
    assert (await client.info(infos[0].id)).state == "aggregating"
    assert (await depth(broker))["aggregating"] == 7
    await start_worker()
    await wait_until(lambda: len(seen) == 2)
    assert sorted(seen) == [("g", [0, 1, 2]), ("g", [3, 4, 5])]
    await wait_until(lambda: _aggregating(broker, 1))  # a batch's task may run before it ends


async def test_a_damaged_batch_stops_no_other_aggregation(app, client, start_worker, broker,
                                                          raw_redis) -> None:
    """A batch key that is not a hash (a hand edit) stays for an operator to see, and the
    queue's other groups are still aggregated."""
    seen: list = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        seen.append(task.payload)

    app.aggregate("add", lambda group, tasks: ("sum", sum(t.payload for t in tasks)),
                  max_size=3, max_delay=30, grace_period=30)
    keys = broker.keys("default")
    for n in range(3):
        raw_redis.set(f"{keys.prefix}batch:damaged-{n}", "not a hash")
        raw_redis.zadd(keys.batches, {f"damaged-{n}": 0})
    for i in range(3):
        await client.enqueue("add", i, group="g")
    await start_worker()
    await wait_until(lambda: seen == [3])
    # the good batch ends after its task is enqueued (which may run first); the damaged
    # ones are still there, each looked at a lease later
    await wait_until(lambda: raw_redis.zcard(keys.batches) == 3, what="the good batch ended")
    assert raw_redis.get(f"{keys.prefix}batch:damaged-0") == b"not a hash"


async def test_a_failing_batchs_tasks_stay_counted_until_it_ends(app, client, start_worker,
                                                                  broker) -> None:
    """Tasks whose aggregator keeps failing are still waiting: the aggregating depth shows
    them (an operator would otherwise see nothing), and they leave it when the batch ends;
    one deleted from the failing batch leaves it when the batch is claimed again."""
    fixed = {"yes": False}
    seen: list = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        seen.append(task.payload)

    def aggregator(group: str, tasks: list[obsq.Task]):
        if not fixed["yes"]:
            raise RuntimeError("a bad deploy")
        return "sum", sorted(t.payload for t in tasks)

    app.aggregate("add", aggregator, max_size=4, max_delay=30, grace_period=30)
    infos = [await client.enqueue("add", i, group="g") for i in range(4)]
    await start_worker()
    await wait_until(lambda: _failed_once(broker))
    assert (await depth(broker))["aggregating"] == 4
    assert await client.cancel(infos[0].id) == "aggregating"  # its aggregator has it
    assert await client.delete(infos[0].id) == "aggregating"  # the way out of a bad batch
    fixed["yes"] = True
    await wait_until(lambda: seen == [[1, 2, 3]], timeout=20)
    await wait_until(lambda: _aggregating(broker, 0))


async def _aggregating(broker: Broker, n: int) -> bool:
    """The depth's aggregating is n (it counts a batch's tasks until the batch ends, just
    after its task is enqueued)."""
    return (await depth(broker))["aggregating"] == n


async def _failed_once(broker: Broker) -> bool:
    keys = broker.keys("default")
    batches = await broker.redis.zrange(keys.batches, 0, -1)
    return any([await broker.redis.hget(f"{keys.prefix}batch:{b.decode()}", "failures")
                for b in batches])


async def test_grace_period_and_bad_input(app, client, start_worker, broker) -> None:
    seen: list = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        seen.append(task.payload)

    calls = {"n": 0}

    async def aggregator(group: str, tasks: list[obsq.Task]):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first run fails")
        if calls["n"] == 2:
            return "junk"
        return "sum", sum(t.payload for t in tasks)

    app.aggregate("add", aggregator, max_size=100, max_delay=30, grace_period=0.2)
    for bad in ("a b", "{x}", ""):
        with pytest.raises(ValueError):
            await client.enqueue("add", 1, group=bad)
    with pytest.raises(ValueError, match="delay"):
        await client.enqueue("add", 1, group="g", delay=5)
    with pytest.raises(ValueError, match="ordering_key"):
        await client.enqueue("add", 1, group="g", ordering_key="k")
    assert (await depth(broker))["aggregating"] == 0
    for i in range(5):
        await client.enqueue("add", i, group="g")
    cancelled = await client.enqueue("add", 100, group="g")
    assert await client.cancel(cancelled.id) == "cancelled"
    await start_worker()
    await wait_until(lambda: seen == [10], timeout=20)
    assert calls["n"] == 3
    await wait_until(lambda: _aggregating(broker, 0))


async def test_cancel_and_delete_take_a_waiting_task_out_of_its_group(app, client,
                                                                      broker) -> None:
    app.aggregate("note", lambda group, tasks: ("note:all", len(tasks)), grace_period=60)
    kept, cancelled, deleted = [await client.enqueue("note", n, group="g") for n in range(3)]
    assert (await depth(broker))["aggregating"] == 3
    assert await client.cancel(cancelled.id) == "cancelled"
    assert await client.delete(deleted.id) == "aggregating"
    assert (await depth(broker))["aggregating"] == 1
    assert (await client.info(cancelled.id)).state == "cancelled"
    with pytest.raises(obsq.TaskNotFound):
        await client.info(deleted.id)
    assert await client.delete(kept.id) == "aggregating"
    assert (await depth(broker))["aggregating"] == 0
    assert not await broker.redis.exists(broker.keys("default").prefix + "gsize:note")


async def test_a_batch_taken_again_after_its_task_was_enqueued_gives_no_second_task(
        app, client, broker, raw_redis, start_worker) -> None:
    """The window a SIGKILL can hit: a worker claimed a batch and enqueued its task, then
    died before ending the batch. The batch's claim runs out, another worker takes it,
    runs the aggregator again, and Redis refuses the task as a duplicate of the first."""
    ran: list[str] = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        ran.append(task.id)

    app.aggregate("add", lambda group, tasks: ("sum", len(tasks)), max_size=2, grace_period=60)
    for n in range(2):
        await client.enqueue("add", n, group="g")
    [batch] = (await broker.claim_batches("default", "a-worker-that-died", 0.2,
                                          [("add", 2, 60.0, 60.0)], 5)).batches
    await client.enqueue("sum", 2, task_id=batch.id, retention=300)  # then it died
    await start_worker()
    k = broker.keys("default")

    def ended_with_one_task() -> bool:  # a second task would be waiting, running or done
        tasks = {*raw_redis.lrange(k.pending, 0, -1), *raw_redis.zrange(k.lease, 0, -1),
                 *raw_redis.zrange(k.completed, 0, -1)}
        return not raw_redis.zcard(k.batches) and tasks == {batch.id.encode()}

    await wait_until(ended_with_one_task, what="the batch ended, with one task")
    assert ran == [batch.id]
    assert (await depth(broker))["aggregating"] == 0


async def test_bytes_payloads_stay_bytes_in_groups_and_events(app, client, start_worker,
                                                              broker) -> None:
    got: list[object] = []

    @app.task("blob:joined")
    async def joined(task: obsq.Task) -> None:
        got.append(task.payload)

    app.aggregate("blob:part", lambda group, tasks: ("blob:joined", b"".join(
        t.payload for t in tasks)), max_size=3, grace_period=60)

    @app.subscribe("blob.stored", name="copier")
    async def copier(task: obsq.Task) -> None:
        got.append(task.payload)

    parts = [bytes([n, 0xFF, 0x00]) for n in range(3)]
    infos = [await client.enqueue("blob:part", part, group="g") for part in parts]
    assert (await client.info(infos[0].id)).payload == parts[0]
    await start_worker()
    await client.publish("blob.stored", b"\x00raw\xff")
    await wait_until(lambda: len(got) == 2)
    assert sorted(got) == sorted([b"".join(parts), b"\x00raw\xff"])


async def test_redis_away_while_enqueueing_an_aggregated_task_is_no_failure(
        app, client, start_worker, monkeypatch) -> None:
    """The aggregator did its part: its batch is not postponed nor counted failed, its
    claim runs out and it is aggregated again."""
    outcomes: list[str] = []
    app.on_aggregation(lambda queue, pattern, outcome: outcomes.append(outcome))
    ran: list[int] = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        ran.append(task.payload)

    app.aggregate("add", lambda group, tasks: ("sum", len(tasks)), grace_period=0.1)
    real, calls = Broker.enqueue, []

    async def away_once(self, queue, messages):
        calls.append(queue)
        if len(calls) == 1:
            raise BrokerError("enqueue", ConnectionError("Redis away"))
        return await real(self, queue, messages)

    monkeypatch.setattr(Broker, "enqueue", away_once)
    for n in range(2):
        await client.enqueue("add", n, group="g")
    await start_worker(aggregate_lease=1)
    await wait_until(lambda: ran == [2] and outcomes == ["success"])
    assert len(calls) == 2
