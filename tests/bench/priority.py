"""What per-task priority costs and what its aging bounds (a report, no asserts).

    python tests/bench/priority.py drain [--tasks 20000] [--rounds 3] [--baseline DIR]
    python tests/bench/priority.py aging [--aging 0.5] [--seconds 8]

`drain`: one `obsq worker priority_app:app` (concurrency 10) on a private Redis drains a
backlog of no-op tasks, all of priority 0 ("p0"), or of priorities 0-9 in turn ("mixed"),
the modes interleaved in each round; with --baseline DIR also "p0 baseline", the worker
importing obsq from DIR (`git archive REV obsq | tar -x -C DIR`, a commit before
priorities); each round starts with the next mode. The clock runs from the unpause of the
queue until no task is pending or running; worker and Redis CPU per task are read from
/proc over the same span.

`aging`: a worker of one slot takes tasks of 5 ms (200/s at best) while a producer sends
priority 9 at 260/s, and one task of priority 0 every 0.25 s, for --seconds;
run with OBSQ_PRIORITY_AGING=--aging and with aging off (3600 s). Prints the waits of
both priorities and how much later than a task of priority 0 the tasks of priority 9 that
ran before it were sent: with aging at most 9 agings, without up to the whole stream."""

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

from plain import cpu_seconds  # noqa: E402
from priority_app import app  # noqa: E402

import obsq  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench-prio"
PREFIX = f"{NAMESPACE}:{{default}}:"


def start_worker(url: str, obsq_dir: str | None, concurrency: int, **env: str
                 ) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
    environ.update(env, PYTHONPATH=str(Path(obsq_dir).resolve()) if obsq_dir else str(ROOT),
                   BENCH_REDIS_URL=url)
    return subprocess.Popen(
        [sys.executable, "-m", "obsq", "worker", "priority_app:app", "--redis-url", url,
         "--namespace", NAMESPACE, "--http-port", "-1", "--no-metrics", "--no-tracing",
         "--concurrency", str(concurrency)],
        cwd=HERE, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def unfinished(raw: redis.Redis) -> int:
    pipe = raw.pipeline(transaction=False)
    pipe.llen(PREFIX + "pending")
    for p in range(1, 10):
        pipe.llen(f"{PREFIX}pending:{p}")
    pipe.hlen(PREFIX + "active")
    pipe.zcard(PREFIX + "scheduled")
    return sum(pipe.execute())


def script_cost(raw: redis.Redis, tasks: int, polls: int) -> tuple[float, float]:
    """(µs of script calls, commands the scripts ran) per task, as Redis counts them
    (INFO commandstats since the reset; less the `polls` of `unfinished`): steadier than
    CPU on a shared host."""
    stats = raw.info("commandstats")
    scripts = stats.get("cmdstat_evalsha", {})
    inside = sum(s["calls"] for name, s in stats.items()
                 if not name.startswith(("cmdstat_eval", "cmdstat_script", "cmdstat_info",
                                         "cmdstat_config")))
    return scripts.get("usec", 0) / tasks, (inside - 12 * polls) / tasks


async def drain(tasks: int, mode: str, obsq_dir: str | None) -> tuple[float, ...]:
    """(tasks/s, worker CPU µs/task, Redis CPU µs/task, script µs/task, commands/task) of
    one drain."""
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    worker = None
    try:
        async with obsq.Client(server.url, namespace=NAMESPACE, app=app) as client:
            for start in range(0, tasks, 1000):
                await client.enqueue_many([
                    obsq.Job("noop", i, priority=i % 10 if mode == "mixed" else 0)
                    for i in range(start, min(start + 1000, tasks))])
        async with obsq.Inspector(server.url, NAMESPACE) as inspector:
            await inspector.pause("default")
            worker = start_worker(server.url, obsq_dir, 10)
            while not raw.keys(f"{NAMESPACE}:worker:*"):
                await asyncio.sleep(0.05)
            cpu, redis_cpu = cpu_seconds(worker.pid), cpu_seconds(server.pid)
            raw.config_resetstat()
            start = time.monotonic()
            await inspector.unpause("default")
        polls = 1
        while unfinished(raw):  # 12 commands a poll
            polls += 1
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu, redis_cpu = cpu_seconds(worker.pid) - cpu, cpu_seconds(server.pid) - redis_cpu
        return (tasks / elapsed, cpu / tasks * 1e6, redis_cpu / tasks * 1e6,
                *script_cost(raw, tasks, polls))
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
        server.close()


def report_drains(args: argparse.Namespace) -> None:
    modes = [("p0", None), ("mixed", None)]
    if args.baseline:
        modes.insert(0, ("p0 baseline", args.baseline))
    figures: dict[str, list[tuple[float, ...]]] = {m: [] for m, _ in modes}
    for round_ in range(args.rounds):
        for mode, obsq_dir in modes[round_ % len(modes):] + modes[:round_ % len(modes)]:
            figures[mode].append(asyncio.run(drain(args.tasks, mode.split()[0], obsq_dir)))
            print(f"round {round_ + 1} {mode:12} {line(figures[mode][-1])}  (load average "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nmedians of {args.rounds} rounds, {args.tasks:,} no-op tasks, concurrency 10:")
    for mode, runs in figures.items():
        print(f"  {mode:12} {line([statistics.median(r[i] for r in runs) for i in range(5)])}")


def line(f: tuple[float, ...] | list[float]) -> str:
    return (f"{f[0]:8,.0f} tasks/s  worker CPU {f[1]:4.0f} µs/task  Redis CPU {f[2]:5.1f} "
            f"µs/task  scripts {f[3]:5.1f} µs/task  {f[4]:5.2f} commands/task")


async def stream(aging: float, seconds: float) -> list[tuple[float, float, float]]:
    """(priority, sent, started) of each task of one run of the stream, in their order."""
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    worker = start_worker(server.url, None, 1, OBSQ_PRIORITY_AGING=repr(aging))
    try:
        while not raw.keys(f"{NAMESPACE}:worker:*"):
            await asyncio.sleep(0.05)
        async with obsq.Client(server.url, namespace=NAMESPACE, app=app) as client:
            start, sent = time.monotonic(), 0
            while time.monotonic() - start < seconds:
                tick = time.monotonic() - start
                high = int(tick * 260) - sent  # above the 200/s one slot of 5 ms takes
                jobs = [obsq.Job("timed", {"p": 9, "t": time.time(), "s": 0.005}, priority=9)
                        for _ in range(high)]
                if int(tick / 0.25) > int((tick - 0.02) / 0.25):
                    jobs.append(obsq.Job("timed", {"p": 0, "t": time.time(), "s": 0.005}))
                if jobs:
                    await client.enqueue_many(jobs)
                sent += high
                await asyncio.sleep(0.02)
        while unfinished(raw):
            await asyncio.sleep(0.05)
        return [tuple(float(x) for x in entry.split())
                for entry in raw.lrange("bench-prio:runs", 0, -1)]
    finally:
        worker.terminate()
        worker.wait(60)
        server.close()


def report_aging(args: argparse.Namespace) -> None:
    for aging in (args.aging, 3600.0):
        runs = asyncio.run(stream(aging, args.seconds))
        low = [(sent, started) for p, sent, started in runs if p == 0]
        high = [(sent, started) for p, sent, started in runs if p == 9]
        # how much later than a task of priority 0 the tasks of 9 that ran before it were
        # sent: with aging, at most 9 agings (plus a fetch's slack)
        ahead = max(max((s9 - s0 for s9, r9 in high if r9 < r0), default=0.0)
                    for s0, r0 in low)
        waits0, waits9 = sorted(r - s for s, r in low), sorted(r - s for s, r in high)
        print(f"OBSQ_PRIORITY_AGING={aging:g}: {args.seconds:g} s of priority 9 at 260/s, more "
              f"than one slot takes ({len(high)} tasks, waited median "
              f"{statistics.median(waits9):.2f} s, max {waits9[-1]:.2f} s) and {len(low)} "
              f"tasks of priority 0 (median "
              f"{statistics.median(waits0):.2f} s, max {waits0[-1]:.2f} s): a task of 0 was "
              f"passed by tasks of 9 sent at most {ahead:.2f} s after it (bound with aging: "
              f"9 x {aging:g} = {9 * aging:g} s)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("drain", "aging"))
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR", help="obsq of an older commit, for p0")
    parser.add_argument("--aging", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=8.0)
    arguments = parser.parse_args()
    (report_drains if arguments.what == "drain" else report_aging)(arguments)
