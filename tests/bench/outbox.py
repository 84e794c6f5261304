"""Figures of the transactional outbox (a report, no asserts), on a private PostgreSQL
(fsync on) and a private Redis, the relay and the worker as the command line runs them:

    python tests/bench/outbox.py [--rows 20000] [--batch 500] [--tasks 1000] [--rate 200]

Throughput: `--rows` rows committed before the relay starts (`obsq outbox --batch N`);
reported: rows/s from its first row moved to its last. Latency: `--tasks` tasks, each
committed in a transaction of its own at `--rate` a second, with the relay and a worker
running (`obsq worker`); reported: from the producer's commit returning to the handler's
start, p50, p99 and the maximum, on PostgreSQL (woken by NOTIFY) and on SQLite (polling
every 0.5 s; a fifth of the tasks at 20 commits a second, as SQLite's single writer makes
the relay's DELETE wait behind a producer committing faster).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from outbox.postgres import PostgresCluster  # noqa: E402
from sqlalchemy import func, insert, select  # noqa: E402
from support import obsq_env  # noqa: E402

import obsq  # noqa: E402
from obsq.outbox import Outbox  # noqa: E402
from obsq.outbox.relay import sync_engine  # noqa: E402
from obsq.outbox.table import row_of  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402
from obsq.task import Job, build_message  # noqa: E402

NAMESPACE = "bench-outbox"
SQLITE_RATE = 20.0  # commits a second on SQLite


def obsq_process(*args: str) -> subprocess.Popen[bytes]:
    env = obsq_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests' / 'bench'}")
    return subprocess.Popen([sys.executable, "-m", "obsq", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(30)


def waiting(outbox: Outbox) -> int:
    with outbox.engine.connect() as conn:  # type: ignore[union-attr]
        return conn.scalar(select(func.count()).select_from(outbox.table)) or 0


def throughput(database_url: str, redis_url: str, rows: int, batch: int) -> float:
    outbox = Outbox(sync_engine(database_url), table_name="bench_throughput")
    outbox.create_table()
    now = time.time()
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        for start in range(0, rows, 1000):
            conn.execute(insert(outbox.table), [
                row_of(build_message(Job("outbox:bench", {"n": n}), now=now), now)
                for n in range(start, min(start + 1000, rows))])
    relay = obsq_process("outbox", "--database-url", database_url, "--redis-url", redis_url,
                         "--namespace", NAMESPACE, "--table", "bench_throughput",
                         "--batch", str(batch), "--http-port", "-1")
    try:
        while (left := waiting(outbox)) == rows:
            time.sleep(0.005)
        started, first = time.perf_counter(), left
        while left:
            time.sleep(0.01)
            left = waiting(outbox)
        return first / (time.perf_counter() - started)
    finally:
        stop(relay)
        outbox.engine.dispose()  # type: ignore[union-attr]


async def latency(database_url: str, redis_url: str, tasks: int, rate: float,
                  table: str) -> list[float]:
    outbox = Outbox(sync_engine(database_url), table_name=table)
    outbox.create_table()
    relay = obsq_process("outbox", "--database-url", database_url, "--redis-url", redis_url,
                         "--namespace", NAMESPACE, "--table", table, "--http-port", "-1")
    worker = obsq_process("worker", "outbox_app:app", "--redis-url", redis_url,
                          "--namespace", NAMESPACE, "--http-port", "-1")
    client = obsq.Client(redis_url, namespace=NAMESPACE)
    committed: dict[str, float] = {}
    try:
        with outbox.engine.begin() as conn:  # type: ignore[union-attr]
            warm_up = outbox.enqueue(conn, "outbox:bench", {}, retention=600)
        while waiting(outbox):  # both started: the relay moved it
            await asyncio.sleep(0.1)
        await client.result(warm_up, timeout=60)  # and the worker ran it
        for n in range(tasks):
            due = time.monotonic() + 1 / rate
            with outbox.engine.begin() as conn:  # type: ignore[union-attr]
                task_id = outbox.enqueue(conn, "outbox:bench", {"n": n}, retention=600)
            committed[task_id] = time.time()
            await asyncio.sleep(max(due - time.monotonic(), 0))
        while waiting(outbox):
            await asyncio.sleep(0.1)
        return [await client.result(task_id, timeout=60) - at
                for task_id, at in committed.items()]
    finally:
        await client.close()
        stop(relay)
        stop(worker)
        outbox.engine.dispose()  # type: ignore[union-attr]


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def report(name: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(f"  {name:<38} p50 {quantile(ms, 0.5):7.1f} ms   p99 {quantile(ms, 0.99):7.1f} ms"
          f"   max {max(ms):7.1f} ms   ({len(ms)} tasks)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    postgres = PostgresCluster(durable=True).start()
    redis_server = RedisServer().start()
    try:
        print(f"relay throughput, PostgreSQL, {args.rows} rows waiting:")
        for batch in sorted({100, args.batch, 1000}):
            rows_per_s = throughput(postgres.url, redis_server.url, args.rows, batch)
            print(f"  --batch {batch:<5} {rows_per_s:9,.0f} rows/s")
            redis_server.stop()
            redis_server.start()  # an empty Redis for the next run
        print(f"commit to handler start, {args.tasks} tasks at {args.rate:g}/s, one a "
              "transaction:")
        report("PostgreSQL (LISTEN/NOTIFY)", asyncio.run(latency(
            postgres.url, redis_server.url, args.tasks, args.rate, "bench_latency")))
        # SQLite's one writer at a time: at 200 commits/s the relay's DELETE waits behind
        # the producer's commits (seconds); 20/s shows the polling's own latency
        with tempfile.TemporaryDirectory() as directory:
            report(f"SQLite (polling every 0.5 s, {SQLITE_RATE:g}/s)", asyncio.run(latency(
                f"sqlite:///{directory}/bench.db", redis_server.url, args.tasks // 5,
                SQLITE_RATE, "bench_latency")))
    finally:
        redis_server.close()
        postgres.stop()


if __name__ == "__main__":
    main()
