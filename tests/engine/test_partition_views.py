"""A partitioned queue (`app.queue("events", partitions=3)`) seen by an operator on a real
Redis: the Inspector, the CLI, the console and the queue gauges show one queue, its depth
summed over its partitions, with each partition's; its name reads and repairs all of them,
and a partition's own name that partition alone."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from support import partitioned_events, wait_until

import obsq
from obsq.inspection.inspector import Inspector
from obsq.names import partition_index, partition_names

PARTS = partition_names("events", 3)


async def _enqueue_mix(client: obsq.Client) -> dict[str, list[str]]:
    """15 pending (types ev:a and ev:b), 6 scheduled, across the partitions."""
    ids: dict[str, list[str]] = {"pending": [], "scheduled": []}
    for i in range(15):
        ids["pending"].append((await client.enqueue(
            "ev:a" if i % 3 else "ev:b", i, queue="events")).id)
    for i in range(6):
        ids["scheduled"].append((await client.enqueue("ev:a", i, queue="events",
                                                      delay=3600)).id)
    return ids


async def _pages(inspector: Inspector, queue: str, state: str, limit: int,
                 type: str | None = None) -> list[str]:
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = await inspector.tasks(queue, state, limit, offset, type)
        seen += [t.id for t in page.tasks]
        offset = page.next_offset
    return seen


async def test_the_inspector_shows_one_queue_with_its_partitions(
        app, client, inspector: Inspector) -> None:
    partitioned_events(app)
    ids = await _enqueue_mix(client)

    assert await inspector.queue_names() == ["events"]
    [info] = await inspector.queues()
    assert info.name == "events" and info.depth["pending"] == 15
    assert info.depth["scheduled"] == 6 and not info.paused
    assert [(p.name, p.index, p.count) for p in info.partitions] == [
        (name, i, 3) for i, name in enumerate(PARTS)]
    assert sum(p.depth["pending"] for p in info.partitions) == 15
    assert sum(p.depth["pending"] > 0 for p in info.partitions) >= 2  # spread by id
    assert info.latency == max(p.latency for p in info.partitions)
    assert (await inspector.queue("events")).depth == info.depth

    # a partition's own name: that partition alone
    alone = await inspector.queue(PARTS[1])
    assert alone.name == PARTS[1] and alone.partitions == []
    assert alone.depth == info.partitions[1].depth

    # pages go through the partitions one after another: every task once
    for limit in (1, 4, 15, 500):
        seen = await _pages(inspector, "events", "pending", limit)
        assert sorted(seen) == sorted(ids["pending"]), limit
    page = await inspector.tasks("events", "pending", 4)
    assert page.total == 15 and page.queue == "events"
    assert {t.queue for t in page.tasks} == {"events"}
    assert {t.partition for t in page.tasks} <= set(PARTS)
    typed = await _pages(inspector, "events", "pending", 2, type="ev:b")
    assert len(typed) == 5 == len(set(typed))
    assert await _pages(inspector, PARTS[0], "pending", 3) == [
        t.id for t in (await inspector.tasks(PARTS[0], "pending", 500)).tasks]

    # a task by id through the queue's name, whichever partition holds it
    for task_id in ids["pending"]:
        detail = await inspector.task(task_id, "events")
        assert detail.queue == "events" and detail.partition in PARTS
        assert (await inspector.task(task_id)).partition == detail.partition
    elsewhere = next(p for p in PARTS if p != detail.partition)
    index, count = partition_index(detail.partition) or (0, 0)
    named = f"it is in queue events (partition {index}/{count}: {detail.partition})"
    with pytest.raises(obsq.TaskNotFound, match=re.escape(named)):
        await inspector.task(detail.id, elsewhere)


async def test_repairs_of_the_queue_act_on_every_partition(
        app, client, inspector: Inspector) -> None:
    partitioned_events(app)
    ids = await _enqueue_mix(client)

    await inspector.pause("events")
    info = await inspector.queue("events")
    assert info.paused and all(p.paused for p in info.partitions)
    await inspector.unpause("events")
    await inspector.pause(PARTS[2])
    info = await inspector.queue("events")  # still served: not paused as a whole
    assert not info.paused and [p.paused for p in info.partitions] == [False, False, True]
    await inspector.unpause("events")
    assert not (await inspector.queue("events")).paused

    # no worker wrote the count to Redis yet: the Inspector still finds the partition
    assert await inspector.delete(ids["pending"][0], "events") == "pending"
    assert await inspector.cancel(ids["pending"][1], "events") == "cancelled"

    some = ids["scheduled"][:2]
    done = await inspector.requeue("events", "scheduled", [*some, "no-such-id"])
    assert (done.moved, done.left, done.missing) == (2, 4, ["no-such-id"])
    done = await inspector.requeue("events", "scheduled")
    assert (done.moved, done.left) == (4, 0)
    assert (await inspector.queue("events")).depth["pending"] == 19
    assert await inspector.purge("events", "pending") == 19
    assert await inspector.purge("events", "cancelled") == 1
    assert (await inspector.queue("events")).size == 0


async def test_groups_of_the_queue_come_from_every_partition(
        app, client, inspector: Inspector) -> None:
    partitioned_events(app)
    app.aggregate("ev:g", lambda group, tasks: ("ev:a", len(tasks)))  # no worker runs it
    for n in range(8):
        for _ in range(n % 3 + 1):
            await client.enqueue("ev:g", n, group=f"g{n}", queue="events")
    groups, offset = [], 0
    while offset is not None:
        page = await inspector.groups("events", limit=3, offset=offset)
        assert page.total == 8 and len(page.groups) <= 3
        groups += page.groups
        offset = page.next_offset
    assert sorted(g.group for g in groups) == [f"g{n}" for n in range(8)]
    assert {g.group: g.size for g in groups} == {f"g{n}": n % 3 + 1 for n in range(8)}
    info = await inspector.queue("events")
    assert info.depth["aggregating"] == 15
    assert sum(p.depth["aggregating"] > 0 for p in info.partitions) >= 2
    for n in (2, 5, 7):
        page = await inspector.group_tasks("events", "ev:g", f"g{n}")
        assert page.total == n % 3 + 1 and {t.queue for t in page.tasks} == {"events"}
    assert (await inspector.group_tasks("events", "ev:g", "none")).total == 0


async def test_worker_outcomes_count_in_the_queue(app, client, start_worker,
                                                  inspector: Inspector) -> None:
    partitioned_events(app)
    await start_worker(queues="events")
    infos = [await client.enqueue("ev:a", "bad" if i % 4 == 0 else i, queue="events",
                                  retention=600) for i in range(12)]
    await wait_until(lambda: _ended(inspector, 12))
    info = await wait_until(lambda: _processed(inspector, 12))
    assert info.depth["completed"] == 9 and info.depth["dead"] == 3
    assert info.last_minute.failed == 3
    assert sum(p.last_minute.processed for p in info.partitions) == 12
    dead = await _pages(inspector, "events", "dead", 2)
    assert sorted(dead) == sorted(i.id for i in infos[::4])


async def _ended(inspector: Inspector, n: int) -> bool:
    depth = (await inspector.queue("events")).depth
    return depth["completed"] + depth["dead"] == n


async def _processed(inspector: Inspector, n: int) -> Any:
    info = await inspector.queue("events")
    return info if info.last_minute.processed == n else None


async def test_cli_shows_one_row_and_the_breakdown(app, client, obsq_cli) -> None:
    partitioned_events(app)
    await _enqueue_mix(client)
    await client.enqueue("ev:a", 1, queue="other")

    code, out = await obsq_cli("queues", "--json")
    assert code == 0
    found = {q["name"]: q for q in json.loads(out)}
    assert sorted(found) == ["events", "other"]
    assert found["events"]["depth"]["pending"] == 15 and found["other"]["partitions"] == []
    assert [p["name"] for p in found["events"]["partitions"]] == list(PARTS)
    assert sum(p["depth"]["pending"] for p in found["events"]["partitions"]) == 15

    code, out = await obsq_cli("queues")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:2] == ["queue", "partitions"]
    assert [line.split()[:3] for line in lines[1:]] == [["events", "3", "15"],
                                                         ["other", "-", "1"]]

    code, out = await obsq_cli("queues", "events")
    assert code == 0
    assert out.splitlines()[1].split()[:3] == ["events", "3", "15"]
    rows = [line.split() for line in out.splitlines() if line.startswith("  events#")]
    assert [r[0] for r in rows] == list(PARTS)
    assert sum(int(r[2]) for r in rows) == 15  # name, index/count, pending, ...

    code, out = await obsq_cli("stats")
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["events", "other"]
    code, out = await obsq_cli("tasks", "events", "scheduled", "--json")
    assert json.loads(out)["total"] == 6
    task = json.loads(out)["tasks"][0]
    assert task["queue"] == "events" and task["partition"] in PARTS
    code, out = await obsq_cli("tasks", "events", "scheduled")
    assert out.splitlines()[0].split()[:3] == ["id", "type", "partition"]
    assert out.splitlines()[1].split()[:3] == [task["id"], "ev:a", task["partition"]]
    code, out = await obsq_cli("tasks", "events", "pending", "--limit", "4")
    assert out.splitlines()[-1] == ("4 shown, 15 pending in events; tasks are listed "
                                    "partition by partition; next page: --offset 4")
    code, out = await obsq_cli("tasks", PARTS[0], "pending")
    assert code == 0 and "partition by partition" not in out
    code, out = await obsq_cli("task", task["id"], "--queue", "events")
    assert f"partition   {task['partition']}" in out
    code, out = await obsq_cli("pause", "events")
    assert (code, out.strip()) == (0, "queue events paused (its 3 partitions)")
    code, out = await obsq_cli("unpause", PARTS[1])
    assert (code, out.strip()) == (0, f"queue {PARTS[1]} unpaused")
    code, out = await obsq_cli("queues")
    assert out.splitlines()[1].split()[-5] == "2/3"  # paused, then the four rates


async def test_doctor_names_the_queue_of_each_partition(app, client, obsq_cli, namespace,
                                                       raw_redis) -> None:
    partitioned_events(app)
    await _enqueue_mix(client)
    code, out = await obsq_cli("doctor")
    waited = re.sub(r"waiting \d+ s", "waiting N s", out)  # a slow host's second may pass
    assert code == 0 and waited.splitlines() == [
        "notice: events: 15 pending task(s), the oldest waiting N s, and no live worker "
        "serves the queue",
        f"namespace '{namespace}': 1 queue(s) (3 counting each partition), no problems, "
        "1 notice(s)"]
    raw_redis.lpush(f"{namespace}:{{{PARTS[1]}}}:pending", "ghost-1")
    code, out = await obsq_cli("doctor")
    assert code == 1
    assert f"events (partition 1/3: {PARTS[1]}): ids with no task in pending: 1 (e.g. " \
        "ghost-1)" in out
    code, out = await obsq_cli("doctor", "--repair")
    assert f"repaired events (partition 1/3: {PARTS[1]}): dropped 1 id(s)" in out


async def test_queue_gauges_sum_the_partitions(app, client, broker, namespace,
                                              raw_redis) -> None:
    from obsq.observability.collector import QueueCollector

    partitioned_events(app)
    await _enqueue_mix(client)
    await client.enqueue("ev:a", 1, queue="other")
    raw_redis.hset(f"{namespace}:partitions", "events", 3)  # as its workers write it
    loop = asyncio.get_running_loop()
    for source in (["events", "other"], broker.queues):  # a worker's names, the exporter's
        collector = QueueCollector(broker, loop, source, cache_seconds=0)
        families = {f.name: f for f in await asyncio.to_thread(collector.collect)}
        depth = {(s.labels["queue"], s.labels["state"]): s.value
                 for s in families["obsq_queue_depth"].samples}
        assert depth[("events", "pending")] == 15 and depth[("events", "scheduled")] == 6
        assert depth[("other", "pending")] == 1
        assert {q for q, _ in depth} == {"events", "other"}
        assert {s.labels["queue"]: s.value for s in families["obsq_queue_partitions"].samples
                } == {"events": 3, "other": 1}


async def test_the_count_is_the_declared_one_and_earlier_partitions_show_while_they_hold(
        redis_url, namespace, raw_redis, inspector: Inspector, obsq_cli) -> None:
    """After 4 -> 2 partitions, the queue has 2; of the 4 earlier ones, those drained are
    left out of the breakdown (the registry keeps them for good), one still holding tasks
    (dead ones here) is listed, marked; every one counts in the sums."""
    earlier, now = partition_names("events", 4), partition_names("events", 2)
    for count, n in ((4, 40), (2, 20)):
        raw_redis.hset(f"{namespace}:partitions", "events", count)  # as its workers write it
        async with obsq.Client(redis_url, namespace) as producer:
            await producer.enqueue_many([obsq.Job("ev:a", i, queue="events")
                                         for i in range(n)])
    for name in earlier[:3]:
        await inspector.purge(name, "pending")
    kept = (await inspector.tasks(earlier[3], "pending", 500)).tasks
    raw_redis.zadd(f"{namespace}:{{{earlier[3]}}}:dead", {kept[0].id: 1})
    raw_redis.lrem(f"{namespace}:{{{earlier[3]}}}:pending", 0, kept[0].id)
    await inspector.purge(earlier[3], "pending")

    info = await inspector.queue("events")
    assert info.partition_count == 2 and info.depth["pending"] == 20
    assert info.depth["dead"] == 1
    assert [(p.name, p.earlier) for p in info.partitions] == [
        *((name, False) for name in now), (earlier[3], True)]
    code, out = await obsq_cli("queues", "events")
    lines = out.splitlines()
    assert code == 0 and lines[1].split()[:3] == ["events", "2", "20"]
    assert "events: 2 partitions, and 1 of an earlier count still holding tasks" in out
    assert f"{earlier[3]} (earlier count, draining)" in out
    assert not any(name in out for name in earlier[:3])

    await inspector.purge(earlier[3], "dead")  # drained: left out
    assert [p.name for p in (await inspector.queue("events")).partitions] == list(now)
