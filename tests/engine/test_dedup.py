"""An enqueue retried with the same task_id never runs the task twice: a task whose producer
chose its id is remembered for the dedup window after obsq deletes it. And unique_for is a
window: a duplicate within it is refused whatever became of the first task."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

import obsq
from obsq.broker import QueueKeys


async def refused(client: obsq.Client, task_id: str) -> bool:
    """Whether an enqueue of `task_id` is refused as a duplicate (an accepted one runs)."""
    try:
        await client.enqueue("t", task_id, task_id=task_id)
    except obsq.DuplicateTask as exc:
        assert exc.existing_id == task_id
        return True
    return False


async def test_a_completed_id_is_refused_within_the_window_and_accepted_after(
        app, client, start_worker, raw_redis, namespace) -> None:
    ran: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.payload)

    keys = QueueKeys(namespace, "default")
    await start_worker(dedup_window=3)
    ids = [f"order-{n}" for n in range(20)]
    for task_id in ids:
        await client.enqueue("t", task_id, task_id=task_id)  # no retention: deleted at once
    generated = await client.enqueue("t", "generated")
    await wait_until(lambda: len(ran) == 21, what="the first 21 tasks run")
    # settled: with no retention a task's hash goes at its ack
    await wait_until(lambda: not any(raw_redis.exists(keys.task(i)) for i in [*ids, generated.id]),
                     what="the 21 settled")
    assert [await refused(client, task_id) for task_id in ids] == [True] * 20
    # only ids the producer chose are remembered: a generated one is never looked up
    assert raw_redis.zscore(keys.ended, generated.id) is None
    await client.enqueue("t", "marker")  # a task run twice would have run before it
    await wait_until(lambda: "marker" in ran)
    assert sorted(ran) == sorted([*ids, "generated", "marker"])  # nothing ran twice

    async def accepted_again() -> bool:
        return not await refused(client, ids[0])

    await wait_until(accepted_again, timeout=30, what="the id accepted after the window")
    await wait_until(lambda: ran.count(ids[0]) == 2, what="the new task with that id runs")


async def test_a_dead_task_deleted_by_the_janitor_stays_remembered(
        app, client, start_worker, raw_redis, namespace) -> None:
    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        raise obsq.SkipRetry("no")

    keys = QueueKeys(namespace, "default")
    await start_worker(dead_max_count=0, janitor_interval=0.1)
    await client.enqueue("t", "x", task_id="dies")
    await wait_until(lambda: raw_redis.zscore(keys.ended, "dies"),
                     what="the janitor deletes the dead task and remembers its id")
    assert not raw_redis.exists(keys.task("dies"))
    assert await refused(client, "dies")


async def test_the_janitor_keeps_at_most_dedup_max_ids_per_queue(
        app, client, start_worker, raw_redis, namespace) -> None:
    ran: list[str] = []

    @app.task("t")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.payload)

    keys = QueueKeys(namespace, "default")
    await start_worker(dedup_max_ids=3, janitor_interval=0.1, concurrency=1)
    for n in range(5):
        await client.enqueue("t", f"c{n}", task_id=f"c{n}")
        await wait_until(lambda n=n: f"c{n}" in ran)
    # an id is remembered by its task's ack, which follows the handler: c4's must be in
    await wait_until(lambda: raw_redis.zscore(keys.ended, "c4") is not None
                     and raw_redis.zcard(keys.ended) == 3, what="trimmed to the cap")
    assert [await refused(client, f"c{n}") for n in range(5)] == [False, False, True, True, True]


async def test_unique_for_refuses_duplicates_whatever_became_of_the_first(
        app, client, start_worker) -> None:
    ran: list[str] = []

    @app.task("u")
    async def handler(task: obsq.Task) -> None:
        ran.append(task.id)

    async def enqueue() -> str | None:
        try:
            return (await client.enqueue("u", {"k": 1}, unique_for=60)).id
        except obsq.DuplicateTask:
            return None

    await start_worker()
    # 50 concurrent duplicates while the first completes quickly: one is accepted
    accepted = [i for i in await asyncio.gather(*(enqueue() for _ in range(50))) if i]
    assert len(accepted) == 1
    await wait_until(lambda: ran == accepted, what="the accepted task completes")
    # completed: still a duplicate within unique_for, however many try at once
    assert [i for i in await asyncio.gather(*(enqueue() for _ in range(50))) if i] == []
    # cancelled or deleted: the same
    for end in ("cancel", "delete"):
        kept = await client.enqueue("u", {"k": end}, unique_for=60, delay=3600)
        await getattr(client, end)(kept.id)
        with pytest.raises(obsq.DuplicateTask):
            await client.enqueue("u", {"k": end}, unique_for=60)
    marker = await client.enqueue("u", {"k": "marker"})  # a duplicate would run before it
    await wait_until(lambda: marker.id in ran)
    assert ran == [*accepted, marker.id]


async def test_a_grouped_task_s_id_is_remembered_once_its_batch_ends(
        app, client, start_worker, raw_redis, namespace) -> None:
    seen: list[list[int]] = []

    @app.task("part")
    async def part(task: obsq.Task) -> None:
        raise AssertionError("grouped tasks never run themselves")

    @app.task("whole")
    async def whole(task: obsq.Task) -> None:
        seen.append(task.payload)

    app.aggregate("part", lambda group, tasks: ("whole", [t.payload for t in tasks]),
                  max_size=2, max_delay=30, grace_period=30)
    await client.enqueue("part", 1, group="g", task_id="part-1")
    await client.enqueue("part", 2, group="g")
    await start_worker()
    await wait_until(lambda: seen == [[1, 2]], what="the batch aggregated")
    keys = QueueKeys(namespace, "default")
    await wait_until(lambda: not raw_redis.exists(keys.task("part-1")), what="the batch ends")
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("part", 1, group="g", task_id="part-1")
    assert raw_redis.zcard(keys.ended) == 1  # the generated id is not remembered


async def test_unique_for_compares_payloads_whatever_the_order_of_their_keys(
        client: obsq.Client) -> None:
    first = await client.enqueue("u", {"key": "k1", "lang": "en"}, unique_for=60)
    with pytest.raises(obsq.DuplicateTask) as caught:
        await client.enqueue("u", {"lang": "en", "key": "k1"}, unique_for=60)
    assert caught.value.existing_id == first.id
    nested = {"a": {"y": 1, "x": [2, {"q": 1, "p": 2}]}}
    await client.enqueue("u", nested, unique_for=60)
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("u", {"a": {"x": [2, {"p": 2, "q": 1}], "y": 1}}, unique_for=60)
    await client.enqueue("u", {"key": "k2", "lang": "en"}, unique_for=60)  # another task
