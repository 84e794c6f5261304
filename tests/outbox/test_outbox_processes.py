"""The relay as the command line runs it: beside a worker (`obsq worker
--outbox-database-url`), its metrics on the worker's endpoint; and `import obsq` without
SQLAlchemy."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from support import ROOT, ObsqProcess, obsq_env, one_clear_line, run_obsq, wait_for

import obsq
from obsq.outbox import Outbox
from obsq.outbox.relay import sync_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_worker_relays_the_outbox_beside_itself_and_runs_the_tasks(
        database_url: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    outbox = Outbox(sync_engine(database_url))
    outbox.create_table()
    outbox.engine.dispose()  # type: ignore[union-attr]
    port = free_port()
    worker = ObsqProcess(["worker", "outbox.worker_app:app", "--redis-url", redis_url,
                          "--namespace", namespace, "--http-port", str(port),
                          "--outbox-database-url", database_url],
                         obsq_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}"), ROOT,
                         tmp_path / "worker.log")
    client = obsq.Client(redis_url, namespace=namespace)
    try:
        with outbox.engine.begin() as conn:  # type: ignore[union-attr]
            task_id = outbox.enqueue(conn, "echo", {"n": 42}, retention=60)
        for _ in range(300):  # the task exists once the relay moved its row
            try:
                await client.info(task_id)
                break
            except obsq.TaskNotFound:
                await asyncio.sleep(0.1)
        assert await client.result(task_id, timeout=30) == {"n": 42}, worker.log()
        metrics = ""
        for _ in range(50):
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            if 'obsq_outbox_relayed_total{table="obsq_outbox"} 1.0' in metrics:
                break
            await asyncio.sleep(0.1)
        assert 'obsq_outbox_relayed_total{table="obsq_outbox"} 1.0' in metrics
        assert 'obsq_outbox_oldest_age_seconds{table="obsq_outbox"}' in metrics
        assert worker.stop() == 0, worker.log()
    finally:
        worker.close()
        await client.close()


def test_import_obsq_leaves_sqlalchemy_out() -> None:
    code = "import sys, obsq; assert 'sqlalchemy' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=obsq_env(), cwd=ROOT)


def test_obsq_outbox_without_a_database_says_so() -> None:
    result = run_obsq("outbox")
    assert result.returncode == 2
    one_clear_line(result, "--database-url", "OBSQ_DATABASE_URL")


def test_obsq_outbox_serves_its_metrics_and_readiness(sqlite_url: str, redis_url: str,
                                                       namespace: str, tmp_path: Path) -> None:
    """Ready while its batches work; not ready while they fail (here: no table yet)."""
    port = free_port()
    relay = ObsqProcess(["outbox", "--database-url", sqlite_url, "--redis-url", redis_url,
                         "--namespace", namespace, "--http-port", str(port)],
                        obsq_env(), ROOT, tmp_path / "relay.log")

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()
        except OSError:
            return 0, ""

    try:
        assert wait_for(lambda: get("/readyz")[0] == 503, timeout=30), relay.log()
        assert "no such table" in get("/readyz")[1]
        Outbox(sync_engine(sqlite_url)).create_table()
        assert wait_for(lambda: get("/readyz")[0] == 200, timeout=30), relay.log()
        metrics = get("/metrics")[1]
        for name in ("obsq_outbox_rows_waiting", "obsq_outbox_oldest_age_seconds",
                     "obsq_outbox_relayed_total"):
            assert f'{name}{{table="obsq_outbox"}}' in metrics
        assert relay.stop() == 0, relay.log()
    finally:
        relay.close()
