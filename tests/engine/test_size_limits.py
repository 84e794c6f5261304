"""What a producer may write is bounded: payloads (1 MiB by default, per App and per route),
headers and task ids. A task over a limit is refused with one line before anything is
written, on every enqueue path: enqueue, enqueue_many, SyncClient and the scheduler's
fires."""

from __future__ import annotations

import logging

import pytest
from support import wait_until

import obsq
from obsq.settings import MAX_HEADERS_BYTES, MAX_PAYLOAD_BYTES

from .helpers import namespace_keys

HUNDRED_MB = 100 * 1024 * 1024


async def test_a_100_mb_payload_is_one_line_before_anything_is_written(
        client, raw_redis, namespace) -> None:
    with pytest.raises(obsq.TaskTooLarge) as refused:
        await client.enqueue("upload", "x" * HUNDRED_MB)
    message = str(refused.value)
    assert "\n" not in message and "'upload'" in message and "1,048,576" in message
    assert isinstance(refused.value, ValueError)  # a bad argument, as the others are
    with pytest.raises(obsq.TaskTooLarge):  # any JSON value, measured encoded
        await client.enqueue("upload", {"rows": ["y" * 1024] * (HUNDRED_MB // 1024)})
    with pytest.raises(obsq.TaskTooLarge):  # bytes, measured as they are
        await client.enqueue("upload", b"z" * HUNDRED_MB)
    assert namespace_keys(raw_redis, namespace) == []
    info = await client.enqueue("upload", "x" * (MAX_PAYLOAD_BYTES - 2))  # with its quotes
    assert info.state == "pending"


async def test_one_task_too_large_spoils_its_batch(client, raw_redis, namespace) -> None:
    jobs = [obsq.Job("small", 1), obsq.Job("big", "x" * (MAX_PAYLOAD_BYTES + 1))]
    with pytest.raises(obsq.TaskTooLarge, match="'big'"):
        await client.enqueue_many(jobs)
    assert namespace_keys(raw_redis, namespace) == []


async def test_headers_and_task_ids_are_bounded(client, raw_redis, namespace) -> None:
    with pytest.raises(obsq.TaskTooLarge, match="headers"):
        await client.enqueue("t", headers={"h": "v" * MAX_HEADERS_BYTES})
    with pytest.raises(ValueError, match="at most 200 characters"):
        await client.enqueue("t", task_id="i" * 201)
    assert namespace_keys(raw_redis, namespace) == []


async def test_the_limit_is_set_per_app_and_per_route(redis_url, namespace, start_worker
                                                      ) -> None:
    app = obsq.App(namespace=namespace, max_payload=1000)
    done: list[int] = []

    @app.task("small")
    async def small(task: obsq.Task) -> None:
        done.append(len(task.payload))

    @app.task("blob:", max_payload=3 * MAX_PAYLOAD_BYTES)
    async def blob(task: obsq.Task) -> None:
        done.append(len(task.payload))

    async with obsq.Client(redis_url, app=app) as client:
        with pytest.raises(obsq.TaskTooLarge, match="1,000 bytes"):
            await client.enqueue("small", "x" * 1000)
        with pytest.raises(obsq.TaskTooLarge, match="1,000 bytes"):  # no route: the App's
            await client.enqueue("unrouted", "x" * 1000)
        await client.enqueue("small", "x" * 900)
        await client.enqueue("blob:store", "x" * (2 * MAX_PAYLOAD_BYTES))
        with pytest.raises(obsq.TaskTooLarge):
            await client.enqueue("blob:store", "x" * (3 * MAX_PAYLOAD_BYTES))
        await start_worker(app)
        await wait_until(lambda: sorted(done) == [900, 2 * MAX_PAYLOAD_BYTES])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_payload"):
            obsq.App(max_payload=bad)
        with pytest.raises(ValueError, match="max_payload"):
            app.task("other", max_payload=bad)


def test_the_sync_client_refuses_too(redis_url, namespace, raw_redis) -> None:
    with obsq.SyncClient(redis_url, namespace) as client, pytest.raises(obsq.TaskTooLarge):
        client.enqueue("t", "x" * HUNDRED_MB)
    assert namespace_keys(raw_redis, namespace) == []


async def test_a_fire_over_its_route_limit_is_logged_not_enqueued(
        redis_url, namespace, start_scheduler, raw_redis, caplog) -> None:
    """A route's limit lower than the default is met when the scheduler enqueues a fire: the
    fire is refused and logged, the scheduler goes on with its other entries."""
    caplog.set_level(logging.INFO, "obsq")
    app = obsq.App(namespace=namespace)

    @app.task("tiny", max_payload=10)
    async def tiny(task: obsq.Task) -> None: ...

    @app.task("fine")
    async def fine(task: obsq.Task) -> None: ...

    app.periodic("@every 0.2s", "tiny", "x" * 100)
    app.periodic("@every 0.2s", "fine", "ok")
    await start_scheduler(app)
    await wait_until(lambda: any("schedule fine fired" in m for m in caplog.messages))
    await wait_until(lambda: any("tiny" in m and "over the limit of 10 bytes" in m
                                 for m in caplog.messages))
    pending = raw_redis.llen(f"{namespace}:{{default}}:pending")
    stored_types = {raw_redis.hget(key, "type") for key in
                    raw_redis.scan_iter(match=f"{namespace}:{{default}}:t:*")}
    assert pending > 0 and stored_types == {b"fine"}
