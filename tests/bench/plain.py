"""The drain rate of quick plain (sync) handlers, in the thread pool or the process pool of
plain handlers (a report, no asserts): one `obsq worker plain_app:app` process on a private
Redis drains a backlog of no-op plain tasks.

    python tests/bench/plain.py [--tasks 20000] [--concurrency 10] [--pool thread|process]
                                [--runs 3]      # each on a fresh Redis, then the median
                                [--max-tasks-per-child N]   # the cost of replacing children
    python tests/bench/plain.py --obsq DIR   # the worker imports obsq from DIR (an export
                                            # of another commit: git archive REV | tar -x)

The queue is paused while the backlog is enqueued and the worker starts; the clock runs from
the unpause until no task is pending or running, so it counts the pool's start (a process
pool's children and fork server) but not the worker's. Worker CPU per task is that of the
worker process and all its descendants (the pool's processes) over the same span, read from
/proc (Linux): on a busy host it varies less than the rate. Without --pool no flag is
passed (for versions without one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from plain_app import app  # noqa: E402

import obsq  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench-plain"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of `pid` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICK
    family = {pid}
    while True:
        grown = family | {p for p, parent in parents.items() if parent in family}
        if grown == family:
            return sum(times.get(p, 0.0) for p in family)
        family = grown


async def drain(args: argparse.Namespace) -> tuple[float, float]:
    """(tasks/s, worker CPU µs per task) of one drain."""
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
    env["PYTHONPATH"] = str(Path(args.obsq).resolve()) if args.obsq else str(ROOT)
    pool = ["--pool", args.pool] if args.pool else []
    if args.max_tasks_per_child:
        pool += ["--max-tasks-per-child", str(args.max_tasks_per_child)]
    worker = None
    try:
        async with obsq.Client(server.url, namespace=NAMESPACE, app=app) as client:
            for start in range(0, args.tasks, 1000):
                await client.enqueue_many([obsq.Job("noop", i) for i in
                                           range(start, min(start + 1000, args.tasks))])
        async with obsq.Inspector(server.url, NAMESPACE) as inspector:
            await inspector.pause("default")  # before any worker: the clock starts later
        worker = subprocess.Popen(
            [sys.executable, "-m", "obsq", "worker", "plain_app:app", "--redis-url",
             server.url, "--namespace", NAMESPACE, "--http-port", "-1", "--no-metrics",
             "--no-tracing", "--concurrency", str(args.concurrency), *pool],
            cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        while not raw.keys(f"{NAMESPACE}:worker:*"):
            await asyncio.sleep(0.05)
        async with obsq.Inspector(server.url, NAMESPACE) as inspector:
            cpu = cpu_seconds(worker.pid)
            start = time.monotonic()
            await inspector.unpause("default")
        pending, active = f"{NAMESPACE}:{{default}}:pending", f"{NAMESPACE}:{{default}}:active"
        while raw.llen(pending) or raw.hlen(active):
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu = cpu_seconds(worker.pid) - cpu
        print(f"{args.tasks} plain no-op tasks, concurrency {args.concurrency}, pool "
              f"{args.pool or '(no flag)'}"
              f"{f', max {args.max_tasks_per_child} a child' if args.max_tasks_per_child else ''}"
              f": {elapsed:.2f} s, {args.tasks / elapsed:,.0f} tasks/s, "
              f"worker CPU {cpu / args.tasks * 1e6:.0f} µs/task "
              f"(load average {os.getloadavg()[0]:.2f})")
        return args.tasks / elapsed, cpu / args.tasks * 1e6
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--pool", choices=("thread", "process"))
    parser.add_argument("--max-tasks-per-child", type=int, default=0)
    parser.add_argument("--obsq", metavar="DIR", help="import the worker's obsq from DIR")
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    figures = [asyncio.run(drain(arguments)) for _ in range(arguments.runs)]
    print(f"median of {arguments.runs}: {statistics.median(f[0] for f in figures):,.0f} "
          f"tasks/s, worker CPU {statistics.median(f[1] for f in figures):.0f} µs/task")
