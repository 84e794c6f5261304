"""The relay as the command line runs it: beside a worker (`obsq worker
--outbox-database-url`), its metrics on the worker's endpoint; and `import obsq` without
SQLAlchemy."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from support import ROOT, ObsqProcess, obsq_env, one_clear_line, run_obsq

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
