"""Fixtures of the engine tests: a broker on the test's namespace, worker and scheduler
subprocesses (`python -m obsq worker tests.engine.apps:app ...`, `python -m obsq scheduler
tests.engine.schedule_apps:app ...`) that a test may kill, and a three-node Redis Cluster
for the whole session.
The files of ACL_USER_FILES run as the user of `obsq acl`'s rule."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from support import ROOT, ObsqProcess, missing_tool, short_interval_env, wait_for

from obsq import cli
from obsq.broker import Broker
from obsq.inspection.inspector import Inspector
from obsq.redis_server import RedisServer, free_port

# The engine's core, run with obsq connecting as a user restricted to `obsq acl`'s rule: a
# command the rule misses fails them, and the session (conftest.py's ACL LOG check).
ACL_USER_FILES = {
    "test_outcomes.py", "test_retries.py", "test_results.py", "test_crash_safety.py",
    "test_cancel.py", "test_maintenance.py", "test_schedules.py", "test_inspector.py",
    "test_cli_admin.py", "test_enqueue_options.py", "test_priority.py", "test_limits.py",
    "test_groups.py", "test_events.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ACL_USER_FILES and item.path.parent.name == "engine":
            item.add_marker(pytest.mark.acl_user)


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    b = Broker(redis_url, namespace)
    yield b
    await b.close()


@pytest.fixture
async def inspector(redis_url: str, namespace: str) -> AsyncIterator[Inspector]:
    async with Inspector(redis_url, namespace) as i:
        yield i


@pytest.fixture
def obsq_cli(redis_url: str, namespace: str, capsys
             ) -> Callable[..., Awaitable[tuple[int, str]]]:
    """`code, output = await obsq_cli("stats")`: the `obsq` command on the test's namespace,
    run in a thread, its stdout and stderr together."""
    async def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, [*argv, "--redis-url", redis_url,
                                                  "--namespace", namespace])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


@pytest.fixture
def spawn_worker(redis_url: str, admin_redis_url: str, namespace: str, tmp_path: Path
                 ) -> Iterator[Callable[..., ObsqProcess]]:
    """`spawn_worker("--lease-seconds", "60")`: a worker subprocess serving
    tests.engine.apps:app (or `app=`) on the test's namespace, with the given OBSQ_*
    variables (tracing off unless `tracing`), killed at the end of the test."""
    started: list[ObsqProcess] = []

    def spawn(*extra: str, concurrency: int = 4, app: str = "tests.engine.apps:app",
              tracing: bool = False, **environ: str) -> ObsqProcess:
        env = {**os.environ, "OBSQ_ENGINE_RECORD_URL": admin_redis_url,
               "OBSQ_ENGINE_RECORD_PREFIX": namespace, "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in env.items() if not k.startswith("OBSQ_") or
               k.startswith("OBSQ_ENGINE_")} | short_interval_env() | environ
        args = ["worker", app,
                "--redis-url", redis_url, "--namespace", namespace,
                "--concurrency", str(concurrency), "--http-port", "0", "--no-metrics",
                *([] if tracing else ["--no-tracing"]), *extra]
        worker = ObsqProcess(args, env, ROOT, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.close()
    for worker in started:
        print(f"--- log of worker {worker.pid} ---\n{worker.log()}")  # shown on failure


@pytest.fixture
def spawn_scheduler(redis_url: str, admin_redis_url: str, namespace: str, tmp_path: Path
                    ) -> Iterator[Callable[..., ObsqProcess]]:
    """`spawn_scheduler(OBSQ_LOCK_TTL="1")`: an `obsq scheduler` subprocess of
    tests.engine.schedule_apps:app on the test's namespace, with the given environment
    (`http_port`: its endpoint's, else none), killed at the end of the test."""
    started: list[ObsqProcess] = []

    def spawn(http_port: int = -1, **environ: str) -> ObsqProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
        env.update({"OBSQ_ENGINE_RECORD_URL": admin_redis_url,
                    "OBSQ_ENGINE_RECORD_PREFIX": namespace,
                    "PYTHONUNBUFFERED": "1", **environ})
        args = ["scheduler", "tests.engine.schedule_apps:app", "--redis-url", redis_url,
                "--namespace", namespace, "--http-port", str(http_port)]
        scheduler = ObsqProcess(args, env, ROOT, tmp_path / f"scheduler-{len(started)}.log")
        started.append(scheduler)
        return scheduler

    yield spawn
    for scheduler in started:
        scheduler.close()
    for scheduler in started:
        print(f"--- log of scheduler {scheduler.pid} ---\n{scheduler.log()}")


# -- Redis Cluster ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """Three masters, no replicas, on free ports; yields a redis+cluster:// URL."""
    cli = shutil.which("redis-cli")
    if not shutil.which("redis-server") or not cli:
        missing_tool("redis-server and redis-cli are needed for the Redis Cluster tests")
    ports: list[int] = []
    while len(ports) < 3:
        port = _cluster_port()
        if not {port, port + 10000} & {q for p in ports for q in (p, p + 10000)}:
            ports.append(port)
    nodes: list[RedisServer] = []
    try:
        for port in ports:
            nodes.append(RedisServer(port, config={
                "cluster-enabled": "yes", "cluster-config-file": f"nodes-{port}.conf",
                "cluster-node-timeout": 5000}).start())
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}"
                               f"{created.stderr}")
        wait_for(lambda: _cluster_ok(ports), timeout=30, what="cluster_state:ok")
        yield f"redis+cluster://127.0.0.1:{ports[0]}"
    finally:
        for node in nodes:
            node.close()


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a valid, free port too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _cluster_ok(ports: list[int]) -> bool:
    for port in ports:
        r = redis.Redis(port=port)
        try:
            if r.cluster("info").get("cluster_state") != "ok":
                return False
        except redis.RedisError:
            return False
        finally:
            r.close()
    # every node must also agree that all slots are served, which a client checks
    try:
        rc = RedisCluster(host="127.0.0.1", port=ports[0])
        rc.set("obsq-probe", 1)
        rc.close()
    except redis.RedisError:
        return False
    return True

