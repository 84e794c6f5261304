"""Fixtures of the engine tests: a broker on the test's namespace, worker and scheduler
subprocesses (`python -m obsq worker tests.engine.apps:app ...`, `python -m obsq scheduler
tests.engine.schedule_apps:app ...`) that a test may kill, and a three-node Redis Cluster
for the whole session."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from support import short_interval_env

from obsq.broker import Broker
from obsq.redis_server import free_port

from .helpers import WorkerProcess


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    b = Broker(redis_url, namespace)
    yield b
    await b.close()


@pytest.fixture
def spawn_worker(redis_url: str, namespace: str, tmp_path: Path
                 ) -> Iterator[Callable[..., WorkerProcess]]:
    """`spawn_worker("--lease-seconds", "60")`: a worker subprocess serving
    tests.engine.apps:app on the test's namespace, killed at the end of the test."""
    started: list[WorkerProcess] = []

    def spawn(*extra: str, concurrency: int = 4) -> WorkerProcess:
        env = {**os.environ, "OBSQ_ENGINE_RECORD_URL": redis_url,
               "OBSQ_ENGINE_RECORD_PREFIX": namespace, "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in env.items() if not k.startswith("OBSQ_") or
               k.startswith("OBSQ_ENGINE_")} | short_interval_env()
        args = [sys.executable, "-m", "obsq", "worker", "tests.engine.apps:app",
                "--redis-url", redis_url, "--namespace", namespace,
                "--concurrency", str(concurrency), "--http-port", "0", "--no-metrics",
                "--no-tracing", *extra]
        worker = WorkerProcess(args, env, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.close()
    for worker in started:
        print(f"--- log of worker {worker.pid} ---\n{worker.log()}")  # shown on failure


@pytest.fixture
def spawn_scheduler(redis_url: str, namespace: str, tmp_path: Path
                    ) -> Iterator[Callable[..., WorkerProcess]]:
    """`spawn_scheduler(OBSQ_LOCK_TTL="1")`: an `obsq scheduler` subprocess of
    tests.engine.schedule_apps:app on the test's namespace, with the given environment
    (`http_port`: its endpoint's, else none), killed at the end of the test."""
    started: list[WorkerProcess] = []

    def spawn(http_port: int = -1, **environ: str) -> WorkerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
        env.update({"OBSQ_ENGINE_RECORD_URL": redis_url, "OBSQ_ENGINE_RECORD_PREFIX": namespace,
                    "PYTHONUNBUFFERED": "1", **environ})
        args = [sys.executable, "-m", "obsq", "scheduler", "tests.engine.schedule_apps:app",
                "--redis-url", redis_url, "--namespace", namespace, "--http-port",
                str(http_port)]
        scheduler = WorkerProcess(args, env, tmp_path / f"scheduler-{len(started)}.log")
        started.append(scheduler)
        return scheduler

    yield spawn
    for scheduler in started:
        scheduler.close()
    for scheduler in started:
        print(f"--- log of scheduler {scheduler.pid} ---\n{scheduler.log()}")


# -- Redis Cluster ------------------------------------------------------------------------


def _redis_binary(name: str) -> str | None:
    return shutil.which(name)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """Three masters, no replicas, on free ports; yields a redis+cluster:// URL."""
    from support import missing_tool

    server, cli = _redis_binary("redis-server"), _redis_binary("redis-cli")
    if not server or not cli:
        missing_tool("redis-server and redis-cli are needed for the Redis Cluster tests")
    directory = tempfile.TemporaryDirectory(prefix="obsq-cluster-")
    ports: list[int] = []
    while len(ports) < 3:
        port = _cluster_port()
        if not {port, port + 10000} & {q for p in ports for q in (p, p + 10000)}:
            ports.append(port)
    processes = []
    try:
        for port in ports:
            processes.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", directory.name, "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-node-timeout", "5000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            _wait_listening(port)
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}"
                               f"{created.stderr}")
        deadline = time.monotonic() + 30
        while not _cluster_ok(ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        yield f"redis+cluster://127.0.0.1:{ports[0]}"
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait(timeout=10)
        directory.cleanup()


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


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port),
                                                                    timeout=0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"redis-server did not listen on port {port}")


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

