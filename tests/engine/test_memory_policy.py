"""A Redis that may evict task data is refused: workers, clients and schedulers stop at start
with one line unless allowed to go on; the tools that only look warn. A worker notices a
policy changed at run time, and the collector exports it as a gauge for an alert."""

from __future__ import annotations

import asyncio
import logging
import shutil
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from support import (
    ObsqProcess,
    missing_tool,
    obsq_env,
    one_clear_line,
    run_obsq,
    wait_for,
    wait_until,
)

import obsq
from obsq.broker import Broker
from obsq.broker.calls import OPERATIONS
from obsq.engine.scheduler import Scheduler
from obsq.errors import BrokerError, ConfigurationError
from obsq.observability.collector import QueueCollector
from obsq.redis_server import RedisServer, free_port
from obsq.settings import SchedulerSettings

EVICTING = "allkeys-lru"


@pytest.fixture
def evicting_redis() -> Iterator[RedisServer]:
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer(config={"maxmemory-policy": EVICTING}).start()
    yield server
    server.close()


@pytest.fixture
def safe_redis() -> Iterator[RedisServer]:
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer(config={"maxmemory-policy": "noeviction"}).start()
    yield server
    server.close()


def keys_of(server: RedisServer) -> list[bytes]:
    r = redis.Redis(port=server.port)
    try:
        return r.keys("*")
    finally:
        r.close()


def test_the_worker_command_refuses_an_evicting_redis_with_one_line(evicting_redis) -> None:
    result = run_obsq("worker", "tests.engine.apps:app", "--redis-url", evicting_redis.url,
                      "--http-port", "-1", "--no-metrics", "--no-tracing")
    line = one_clear_line(result, f"maxmemory-policy {EVICTING}", "noeviction",
                          "--allow-eviction")
    assert result.returncode == 1, line
    assert keys_of(evicting_redis) == []  # not even registered


def test_the_scheduler_command_refuses_it_too(evicting_redis) -> None:
    result = run_obsq("scheduler", "tests.engine.schedule_apps:app", "--redis-url",
                      evicting_redis.url, "--http-port", "-1")
    one_clear_line(result, f"maxmemory-policy {EVICTING}")


async def test_a_client_refuses_before_writing_unless_allowed(evicting_redis,
                                                              monkeypatch) -> None:
    async with obsq.Client(evicting_redis.url, "ns") as client:
        with pytest.raises(ConfigurationError, match=f"maxmemory-policy {EVICTING}") as no:
            await client.enqueue("t", 1)
        assert str(no.value).endswith("accept losing tasks with Client(allow_eviction=True) "
                                      "or OBSQ_ALLOW_EVICTION=true"), no.value
        with pytest.raises(ConfigurationError):  # and again: refused every time
            await client.enqueue("t", 2)
    assert keys_of(evicting_redis) == []
    async with obsq.Client(evicting_redis.url, "ns", allow_eviction=True) as client:
        await client.enqueue("t", 3)
    monkeypatch.setenv("OBSQ_ALLOW_EVICTION", "yes")
    async with obsq.Client(evicting_redis.url, "ns") as client:
        await client.enqueue("t", 4)
    assert len(keys_of(evicting_redis)) > 0


def test_the_sync_client_refuses_too(evicting_redis) -> None:
    with obsq.SyncClient(evicting_redis.url, "ns") as client, \
            pytest.raises(ConfigurationError, match=r"Client\(allow_eviction=True\)"):
        client.enqueue("t", 1)
    assert keys_of(evicting_redis) == []


async def test_a_worker_allowed_to_starts_and_warns(evicting_redis, app, start_worker,
                                                    caplog) -> None:
    refused = obsq.Worker(app, redis_url=evicting_redis.url, handle_signals=False)
    with pytest.raises(ConfigurationError, match=EVICTING):
        await refused.run()
    caplog.set_level(logging.WARNING, "obsq")
    worker = await start_worker(redis_url=evicting_redis.url, allow_eviction=True)
    assert worker.describe()["maxmemory_policy"] == EVICTING
    assert any(f"maxmemory-policy {EVICTING}" in m for m in caplog.messages)


async def test_an_allowed_worker_enqueues_its_aggregated_tasks(evicting_redis, app,
                                                               start_worker) -> None:
    ran: list[int] = []

    @app.task("sum")
    async def total(task: obsq.Task) -> None:
        ran.append(task.payload)

    app.aggregate("add", lambda group, tasks: ("sum", len(tasks)), grace_period=0.1)
    await start_worker(redis_url=evicting_redis.url, allow_eviction=True)
    async with obsq.Client(evicting_redis.url, app=app, allow_eviction=True) as client:
        for n in range(3):
            await client.enqueue("add", n, group="g")
    await wait_until(lambda: ran == [3])


async def test_scheduler_allowed_by_its_settings(evicting_redis, app) -> None:
    refused = Scheduler(app, evicting_redis.url, handle_signals=False)
    with pytest.raises(ConfigurationError, match=EVICTING):
        await refused.run()
    allowed = Scheduler(app, evicting_redis.url, handle_signals=False,
                        settings=SchedulerSettings(allow_eviction=True, lock_ttl=1.0))
    running = asyncio.ensure_future(allowed.run())
    await wait_until(lambda: allowed.started_at or running.done())
    allowed.stop()
    await running


async def test_the_inspector_and_the_cli_only_warn(evicting_redis, caplog) -> None:
    caplog.set_level(logging.WARNING, "obsq")
    inspector = obsq.Inspector(evicting_redis.url, "ns")
    await inspector.check()
    await inspector.close()
    assert any(f"maxmemory-policy {EVICTING}" in r.message for r in caplog.records)
    result = run_obsq("stats", "--redis-url", evicting_redis.url, "--namespace", "ns")
    assert result.returncode == 0, result.stderr
    assert EVICTING in result.stderr


def test_the_exporter_only_warns(evicting_redis, tmp_path) -> None:
    port = free_port()
    exporter = ObsqProcess(["exporter", "--redis-url", evicting_redis.url, "--http-port",
                            str(port)], obsq_env(), tmp_path, tmp_path / "exporter.log")
    try:
        body = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode(), timeout=20,
            what="the exporter's /metrics")
        assert "obsq_redis_maxmemory_policy_ok 0.0" in body, body
        assert EVICTING in exporter.log()
    finally:
        exporter.close()


async def test_a_change_at_run_time_is_warned_and_exported(safe_redis, app, start_worker,
                                                           caplog) -> None:
    caplog.set_level(logging.INFO, "obsq")
    worker = await start_worker(redis_url=safe_redis.url, policy_check_interval=0.2)
    collector = QueueCollector(worker.broker, asyncio.get_running_loop(), ["default"],
                               cache_seconds=0)

    def policy_gauge() -> float | None:
        for family in collector.collect():
            if family.name == "obsq_redis_maxmemory_policy_ok":
                return family.samples[0].value if family.samples else None
        return None

    assert await asyncio.to_thread(policy_gauge) == 1
    r = redis.Redis(port=safe_redis.port)
    r.config_set("maxmemory-policy", "volatile-ttl")
    await wait_until(lambda: worker.describe()["maxmemory_policy"] == "volatile-ttl",
                     what="the heartbeat reading the new policy")
    assert any("volatile-ttl" in m and "changed at run time" in m for m in caplog.messages)
    assert await asyncio.to_thread(policy_gauge) == 0
    assert worker.started_at and not worker.draining  # a running worker goes on
    r.config_set("maxmemory-policy", "noeviction")
    await wait_until(lambda: worker.describe()["maxmemory_policy"] == "noeviction")
    assert await asyncio.to_thread(policy_gauge) == 1
    r.close()


async def test_config_denied_falls_back_to_info_and_else_warns_once(safe_redis,
                                                                    caplog) -> None:
    r = redis.Redis(port=safe_redis.port)
    r.config_set("maxmemory-policy", EVICTING)
    r.acl_setuser("noconfig", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-config"])
    r.acl_setuser("blind", enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-config", "-info"])
    r.close()
    url = f"redis://{{}}:pw@127.0.0.1:{safe_redis.port}/0"
    broker = Broker(url.format("noconfig"), "ns")
    assert await broker.memory_policy() == EVICTING
    with pytest.raises(ConfigurationError, match=EVICTING):
        await broker.check_memory_policy(refuse=True)
    await broker.close()

    caplog.set_level(logging.WARNING, "obsq")
    async with obsq.Client(url.format("blind"), "ns") as client:
        await client.enqueue("t", 1)
        await client.enqueue("t", 2, queue="other")
    warnings = [m for m in caplog.messages if "cannot read Redis's maxmemory-policy" in m]
    assert len(warnings) == 1, caplog.messages
    assert ":pw@" not in warnings[0]


async def test_a_failed_read_is_a_counted_redis_error(safe_redis) -> None:
    assert "memory_policy" in OPERATIONS
    failed: list[str] = []
    broker = Broker(safe_redis.url, "ns", on_error=lambda operation, exc: failed.append(operation))
    safe_redis.stop()
    with pytest.raises(BrokerError):
        await broker.memory_policy()
    assert failed == ["memory_policy"]
    await broker.close()
