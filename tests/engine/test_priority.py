"""Weighted and strict queue priority, and pausing a queue."""

from __future__ import annotations

import pytest
from support import wait_until

import obsq
from obsq.broker import Broker

PER_QUEUE = 150
FIRST_PICKS = 140


async def _fill_two_queues(client: obsq.Client) -> None:
    for queue in ("heavy", "light"):
        await client.enqueue_many([obsq.Job("pick", i, queue=queue) for i in range(PER_QUEUE)])


def _record_picks(app: obsq.App) -> list[str]:
    picks: list[str] = []

    @app.task("pick")
    async def pick(task: obsq.Task):
        picks.append(task.queue)

    return picks


async def test_weighted_priority_favours_the_heavy_queue_without_starving(
        app, client, start_worker) -> None:
    picks = _record_picks(app)
    await _fill_two_queues(client)
    await start_worker(queues={"heavy": 6, "light": 1}, concurrency=1)
    await wait_until(lambda: len(picks) >= FIRST_PICKS, timeout=30)
    first = picks[:FIRST_PICKS]
    heavy, light = first.count("heavy"), first.count("light")
    # 6:1 means about 120:20 of 140 picks; the bounds leave room for chance (>5 sigma)
    assert heavy >= 0.7 * FIRST_PICKS, (heavy, light)
    assert light >= 3, (heavy, light)  # the light queue is served while heavy has work
    await wait_until(lambda: len(picks) == 2 * PER_QUEUE, timeout=30)


async def test_strict_priority_empties_the_high_queue_first(app, client,
                                                            start_worker) -> None:
    picks = _record_picks(app)
    await _fill_two_queues(client)
    await start_worker(queues={"heavy": 6, "light": 1}, concurrency=1, strict_priority=True)
    await wait_until(lambda: len(picks) == 2 * PER_QUEUE, timeout=30)
    assert picks == ["heavy"] * PER_QUEUE + ["light"] * PER_QUEUE


async def test_a_paused_queue_is_not_served(app, client, start_worker, broker: Broker,
                                            raw_redis, namespace) -> None:
    ran: list[str] = []

    @app.task("work")
    async def work(task: obsq.Task):
        ran.append(f"{task.queue}:{task.payload}")

    await broker.set_paused("emails", True)
    await start_worker(queues="emails,default")
    held = await client.enqueue("work", "held", queue="emails")
    # the other queue of the same worker is served meanwhile
    await client.enqueue("work", "a", queue="default")
    await wait_until(lambda: "default:a" in ran)
    # and so is a new task on it after the worker had a chance to look at emails
    await client.enqueue("work", "b", queue="default")
    await wait_until(lambda: "default:b" in ran)
    assert "emails:held" not in ran
    assert (await client.info(held.id)).state == "pending"
    stats = await broker.queue_stats(["emails"])
    assert stats["emails"].paused is True
    assert stats["emails"].depth["pending"] == 1

    await broker.set_paused("emails", False)
    await wait_until(lambda: "emails:held" in ran, timeout=10)
    assert not raw_redis.exists(f"{namespace}:{{emails}}:paused")


@pytest.mark.parametrize("strict", [False, True])
async def test_a_paused_high_priority_queue_does_not_block_the_others(
        app, client, start_worker, broker: Broker, strict: bool) -> None:
    ran: list[str] = []

    @app.task("work")
    async def work(task: obsq.Task):
        ran.append(task.queue)

    await broker.set_paused("critical", True)
    await client.enqueue_many([obsq.Job("work", i, queue="critical") for i in range(5)])
    await client.enqueue_many([obsq.Job("work", i, queue="low") for i in range(5)])
    await start_worker(queues={"critical": 10, "low": 1}, concurrency=2,
                       strict_priority=strict)
    await wait_until(lambda: len(ran) == 5)
    assert ran == ["low"] * 5


async def test_unpausing_wakes_idle_workers_for_the_tasks_that_waited(
        client, broker: Broker, raw_redis, namespace) -> None:
    await broker.set_paused("emails", True)
    for n in range(3):
        await client.enqueue("work", n, queue="emails")
    raw_redis.delete(f"{namespace}:{{emails}}:wake")  # as if idle workers had taken them
    await broker.set_paused("emails", False)
    # one wake token per waiting task: idle workers blocked on the wake list start at once
    assert raw_redis.llen(f"{namespace}:{{emails}}:wake") == 3
