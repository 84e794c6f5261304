"""Defaults that must not route work to nowhere: a worker without --queues serves its App's
queues, a Client given the App writes to the App's namespace and queues, and a producer
without an App hears when nobody serves the queue it writes to."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
from support import ROOT, wait_until

import obsq


def _routed_app(namespace: str) -> obsq.App:
    app = obsq.App(namespace=namespace)

    @app.task("alert:page", queue="critical")
    async def page(task: obsq.Task):
        return "paged"

    @app.task("report:")
    async def report(task: obsq.Task):
        return "reported"

    return app


async def test_a_worker_without_queues_serves_every_queue_its_routes_declare(
        redis_url, namespace, start_worker) -> None:
    app = _routed_app(namespace)
    worker = await start_worker(app)
    assert worker.queues == {"critical": 1, "default": 1}
    async with obsq.Client(redis_url, app=app) as client:
        paged = await client.enqueue("alert:page", retention=60)
        reported = await client.enqueue("report:daily", retention=60)
        assert paged.queue == "critical" and reported.queue == "default"
        assert await client.result(paged, timeout=10) == "paged"
        assert await client.result(reported, timeout=10) == "reported"


async def test_the_worker_command_logs_the_queues_it_serves(spawn_worker) -> None:
    worker = spawn_worker()  # no --queues: the queues of tests.engine.apps:app
    await wait_until(lambda: "started: queues default=1," in worker.log(), timeout=20)


async def test_a_client_given_the_app_uses_its_namespace(redis_url, namespace,
                                                         start_worker) -> None:
    app = _routed_app(namespace)
    await start_worker(app)
    async with obsq.Client(redis_url, app=app) as client:
        assert client.namespace == namespace
        info = await client.enqueue("alert:page", retention=60)
        assert await client.result(info, timeout=10) == "paged"


async def test_a_sync_client_given_the_app_routes_to_the_apps_queue(redis_url, namespace,
                                                                    start_worker) -> None:
    app = _routed_app(namespace)
    await start_worker(app)
    def produce() -> tuple[str, str]:  # in a thread: the worker runs on this event loop
        with obsq.SyncClient(redis_url, app=app) as client:
            info = client.enqueue("alert:page", retention=60)
            return info.queue, client.result(info, timeout=10)

    assert await asyncio.to_thread(produce) == ("critical", "paged")


async def test_a_client_without_the_app_warns_once_of_a_queue_no_worker_serves(
        redis_url, namespace, start_worker, caplog) -> None:
    await start_worker(_routed_app(namespace))  # serves critical and default
    caplog.set_level(logging.WARNING, logger="obsq")
    async with obsq.Client(redis_url, namespace) as client:
        for _ in range(3):
            await client.enqueue("x", queue="nobody")
            await client.enqueue("x", queue="critical")
        await wait_until(lambda: "no live worker serves" in caplog.text)
    warnings = [r.getMessage() for r in caplog.records if "no live worker" in r.getMessage()]
    assert len(warnings) == 1 and "'nobody'" in warnings[0]


async def test_a_worker_outside_its_apps_namespace_is_said_by_worker_scheduler_and_client(
        redis_url, namespace, start_worker, raw_redis, caplog) -> None:
    """OBSQ_NAMESPACE=elsewhere with App(namespace=...): the producers using the App write
    where no worker looks. The worker and scheduler say so at start, and the App's Client
    says its queue has no live worker."""
    from obsq.engine.scheduler import Scheduler

    caplog.set_level(logging.INFO, logger="obsq")
    app, elsewhere = _routed_app(namespace), f"{namespace}-elsewhere"
    try:
        await start_worker(app, namespace=elsewhere)
        scheduler = Scheduler(app, redis_url, elsewhere, handle_signals=False)
        running = asyncio.create_task(scheduler.run())
        await wait_until(lambda: "scheduler serves namespace" in caplog.text, timeout=10)
        scheduler.stop()
        await running
        async with obsq.Client(redis_url, app=app) as client:
            await client.enqueue("alert:page")
            await client.enqueue("alert:page")
            await wait_until(lambda: "no live worker serves" in caplog.text, timeout=10)
    finally:
        for key in raw_redis.scan_iter(match=f"{elsewhere}:*"):
            raw_redis.unlink(key)
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"namespace {elsewhere} on Redis" in m for m in messages if "started" in m)
    for who in ("worker", "scheduler"):
        [warning] = [m for m in messages if f"{who} serves namespace" in m]
        assert f"'{elsewhere}'" in warning and f"write to '{namespace}'" in warning
    [unserved] = [m for m in messages if "no live worker serves" in m]
    assert f"queue 'critical' of namespace '{namespace}'" in unserved


@pytest.mark.parametrize("queues, expected", [
    ("critical:6,default=3", "as in critical=6"),
    ("my queue=1", "must not contain spaces"),
])
def test_the_worker_command_refuses_queue_typos(redis_url, queues, expected) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "obsq", "worker", "tests.engine.apps:app", "--redis-url",
         redis_url, "--queues", queues], cwd=ROOT, capture_output=True, text=True, timeout=30)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2
    assert len(lines) == 1 and expected in lines[0], lines
