"""A hook that raises changes nothing obsq knows or does (obsq/app.py, Hooks): a failed Redis call
still raises its BrokerError, the worker's health still sees Redis gone within a
heartbeat, a task still settles, and the hook's failure is logged once, not per call."""

from __future__ import annotations

import logging

import pytest
from support import ended, wait_until

import obsq
from obsq.app import Hooks
from obsq.engine.liveness import redis_away
from obsq.redis_server import RedisServer


def broken(*args: object) -> None:
    raise RuntimeError("a hook with a bug")


def test_a_raising_hook_is_logged_once_and_the_others_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[int] = []
    hooks: Hooks[[int]] = Hooks("test hook")
    hooks.append(broken)
    hooks.append(heard.append)
    with caplog.at_level(logging.DEBUG, logger="obsq"):
        hooks(1)
        hooks(2)
    assert heard == [1, 2]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "test hook" in errors[0].getMessage()
    assert errors[0].exc_info is not None


async def test_a_raising_redis_error_hook_leaves_the_broker_error(
        app: obsq.App, namespace: str) -> None:
    server = RedisServer().start()
    client = obsq.Client(server.url, namespace, app=app, call_timeout=2)
    client.redis_error_hooks.append(broken)
    try:
        await client.enqueue("x", {})
        server.stop()
        with pytest.raises(obsq.BrokerError):
            await client.enqueue("x", {})
    finally:
        await client.close()
        server.close()


async def test_the_worker_sees_redis_gone_though_its_redis_error_hook_raises(
        app: obsq.App, namespace: str, start_worker) -> None:
    """The heartbeat thread's failed call reaches the hook first: a hook that raised there
    kept `redis_ok` true, and readiness said "has not answered" 25 s later instead of
    "Redis is unreachable" at the next beat."""
    app.on_redis_error(broken)
    server = RedisServer().start()
    try:
        worker = await start_worker(redis_url=server.url, namespace=namespace)
        await wait_until(lambda: worker.health().redis_ok)
        server.stop()
        await wait_until(lambda: not worker.health().redis_ok, timeout=10)
        assert redis_away(worker.health()) == "Redis is unreachable"
        server.start()
        await wait_until(lambda: worker.health().redis_ok, timeout=10)
    finally:
        server.close()


async def test_a_raising_outcome_hook_leaves_the_task_settled(
        app: obsq.App, client: obsq.Client, start_worker,
        caplog: pytest.LogCaptureFixture) -> None:
    @app.task("fails")
    async def fails(task: obsq.Task) -> None:
        raise obsq.SkipRetry("no")

    @app.task("works")
    async def works(task: obsq.Task) -> int:
        return 1

    app.on_outcome(broken)
    await start_worker()
    with caplog.at_level(logging.ERROR, logger="obsq"):
        infos = [await client.enqueue(t, {}, retention=60) for t in ("works", "fails") * 2]
        for info in infos:
            await wait_until(lambda i=info: ended(client, i.id))
    states = [(await client.info(i.id)).state for i in infos]
    assert states == ["completed", "dead"] * 2
    assert sum("outcome hook" in r.getMessage() for r in caplog.records) == 1

