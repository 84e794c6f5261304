"""What fairness keys cost (a report, no asserts).

    python tests/bench/fairness.py [--tasks 20000] [--rounds 3] [--baseline DIR]
                                   [--distinct 100000]

One `obsq worker priority_app:app` (concurrency 10) on a private Redis drains a backlog of
no-op tasks: without keys ("no keys"), over 10 fairness keys in turn ("10 keys"), and with
--distinct tasks each of its own key ("N keys", a key per task: the ring at its longest);
with --baseline DIR also "baseline", the worker and producer importing obsq from DIR
(`git archive REV obsq | tar -x -C DIR`, a commit before fairness keys), without keys.
The modes are interleaved, each round starting with the next. Printed per drain: tasks/s,
worker and Redis CPU per task (/proc, over the drain), the scripts' µs and the commands
they ran per task (INFO commandstats), and the memory the waiting backlog took in Redis
(used_memory after the enqueue less before it), per task."""

from __future__ import annotations

import argparse
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

from plain import cpu_seconds  # noqa: E402
from priority import NAMESPACE, PREFIX, script_cost, start_worker  # noqa: E402

from obsq.redis_server import RedisServer  # noqa: E402

PRODUCER = """
import asyncio, sys
import obsq
from priority_app import app

async def main(url, tasks, keys):
    async with obsq.Client(url, namespace=app.namespace, app=app) as client:
        for start in range(0, tasks, 1000):
            jobs = []
            for i in range(start, min(start + 1000, tasks)):
                key = {} if keys == 0 else {"fairness_key": f"tenant-{i % keys}"}
                jobs.append(obsq.Job("noop", i, **key))
            await client.enqueue_many(jobs)
        async with obsq.Inspector(url, app.namespace) as inspector:
            await inspector.pause("default")

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def unfinished(raw: redis.Redis) -> int:
    pipe = raw.pipeline(transaction=False)
    pipe.llen(PREFIX + "pending")
    pipe.get(PREFIX + "fairn")
    pipe.hlen(PREFIX + "active")
    pipe.zcard(PREFIX + "scheduled")
    return sum(int(n or 0) for n in pipe.execute())


def enqueue(url: str, tasks: int, keys: int, obsq_dir: str | None) -> None:
    """The backlog, written (and the queue paused) by a producer of the drain's obsq."""
    path = str(Path(obsq_dir).resolve()) if obsq_dir else str(ROOT)
    subprocess.run([sys.executable, "-c", PRODUCER, url, str(tasks), str(keys)], cwd=HERE,
                   env={**os.environ, "PYTHONPATH": f"{path}:{HERE}"}, check=True)


def drain(tasks: int, keys: int, obsq_dir: str | None) -> tuple[float, ...]:
    """(tasks/s, worker CPU µs/task, Redis CPU µs/task, script µs/task, commands/task,
    bytes/task waiting) of one drain."""
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    worker = None
    try:
        raw.execute_command("SADD", f"{NAMESPACE}:queues", "default")
        before = raw.info("memory")["used_memory"]
        enqueue(server.url, tasks, keys, obsq_dir)
        waiting = (raw.info("memory")["used_memory"] - before) / tasks
        worker = start_worker(server.url, obsq_dir, 10)
        while not raw.keys(f"{NAMESPACE}:worker:*"):
            time.sleep(0.05)
        cpu, redis_cpu = cpu_seconds(worker.pid), cpu_seconds(server.pid)
        raw.config_resetstat()
        start = time.monotonic()
        raw.delete(PREFIX + "paused")
        raw.lpush(PREFIX + "wake", *["1"] * 10)
        polls = 1
        while unfinished(raw):
            polls += 1
            time.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu, redis_cpu = cpu_seconds(worker.pid) - cpu, cpu_seconds(server.pid) - redis_cpu
        # the polls here run 4 commands, not the 12 script_cost takes off
        seconds, commands = script_cost(raw, tasks, 0)
        return (tasks / elapsed, cpu / tasks * 1e6, redis_cpu / tasks * 1e6, seconds,
                commands - 4 * polls / tasks, waiting)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        server.close()


def line(f: tuple[float, ...] | list[float]) -> str:
    return (f"{f[0]:8,.0f} tasks/s  worker CPU {f[1]:4.0f} µs/task  Redis CPU {f[2]:5.1f} "
            f"µs/task  scripts {f[3]:5.1f} µs/task  {f[4]:5.2f} commands/task  "
            f"waiting {f[5]:5.0f} B/task")


def report(args: argparse.Namespace) -> None:
    modes: list[tuple[str, int, int, str | None]] = [
        ("no keys", args.tasks, 0, None), ("10 keys", args.tasks, 10, None),
        (f"{args.distinct:,} keys", args.distinct, args.distinct, None)]
    if args.baseline:
        modes.insert(0, ("baseline", args.tasks, 0, args.baseline))
    figures: dict[str, list[tuple[float, ...]]] = {m[0]: [] for m in modes}
    for round_ in range(args.rounds):
        for name, tasks, keys, obsq_dir in modes[round_ % len(modes):] + modes[
                :round_ % len(modes)]:
            figures[name].append(drain(tasks, keys, obsq_dir))
            print(f"round {round_ + 1} {name:14} {line(figures[name][-1])}  (load average "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nmedians of {args.rounds} rounds, no-op tasks, concurrency 10:")
    for name, runs in figures.items():
        print(f"  {name:14} {line([statistics.median(r[i] for r in runs) for i in range(6)])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--distinct", type=int, default=100000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR", help="obsq before fairness keys")
    report(parser.parse_args())
