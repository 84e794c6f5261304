"""What partitioning a queue costs and what it buys (a report, no asserts).

    python tests/bench/partitions.py drain [--tasks 20000] [--rounds 3] [--concurrency 10]
    python tests/bench/partitions.py cluster [--tasks 20000] [--rounds 3] [--workers 1]
    python tests/bench/partitions.py pickup [--tasks 200]
    python tests/bench/partitions.py limits [--tasks 1000]

`drain`: one `obsq worker partition_app:app` (--concurrency) on one private Redis drains a
backlog of no-op tasks from a queue of 1, 3 and 8 partitions, the counts interleaved in each
round: tasks/s, worker and Redis CPU per task (/proc), script time and commands per task
(INFO commandstats): the Redis work a task costs, summed over its partitions.

`cluster`: the same on a Redis Cluster of 3 masters (one process each), a queue of 1 and of
3 partitions, `--workers` worker processes: the masters' CPU per task summed, and each
master's share of it.

`pickup`: an idle worker (its wait 30 s long) and one task sent every 20 ms: how long from
the send to the handler's start, by the partition that held it, for 1 and 3 partitions, on
one Redis and on the Cluster.

`limits`: a route limited to 100 starts a second and 4 at once drains --tasks tasks from a
queue of 1 and of 3 partitions, spread by id or all of one ordering key: the rate reached
and the most running at once (each partition keeps its share of the limits)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from plain import cpu_seconds  # noqa: E402

import obsq  # noqa: E402
from obsq.names import partition_names  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench-part"


class Servers:
    """One Redis, or a Cluster of `masters` (each its own process)."""

    def __init__(self, masters: int = 0) -> None:
        self.nodes = [RedisServer(port=cluster_port(), config={
            "cluster-enabled": "yes", "cluster-config-file": "nodes.conf"}).start()
            for _ in range(masters)] if masters else [RedisServer().start()]
        if masters:
            subprocess.run([shutil.which("redis-cli"), "--cluster", "create",
                            *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            while any(b"cluster_state:ok" not in redis.Redis(port=n.port).execute_command(
                    "CLUSTER", "INFO") for n in self.nodes):
                time.sleep(0.1)
            self.url = f"redis+cluster://127.0.0.1:{self.nodes[0].port}"
            self.raw = RedisCluster(host="127.0.0.1", port=self.nodes[0].port)
        else:
            self.url = self.nodes[0].url
            self.raw = redis.Redis.from_url(self.url)

    def cpu(self) -> list[float]:
        return [cpu_seconds(n.pid) for n in self.nodes]

    def script_usec(self) -> float:
        return sum(redis.Redis(port=n.port).info("commandstats").get(
            "cmdstat_evalsha", {}).get("usec", 0) for n in self.nodes)

    def reset(self) -> None:
        for n in self.nodes:
            redis.Redis(port=n.port).config_resetstat()

    def close(self) -> None:
        for n in self.nodes:
            n.close()


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port + 10000 <= 65535:
                try:
                    b.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
                return port


def start_worker(url: str, queue: str, concurrency: int = 10, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "obsq", "worker", "partition_app:app", "--redis-url", url,
         "--namespace", NAMESPACE, "--http-port", "-1", "--no-metrics", "--no-tracing",
         "--concurrency", str(concurrency), "--queues", queue],
        cwd=HERE, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


async def live_workers(inspector: obsq.Inspector, count: int) -> None:
    while len(await inspector.workers()) < count:
        await asyncio.sleep(0.05)


async def depth(servers: Servers, names: tuple[str, ...]) -> int:
    pipe = servers.raw.pipeline(transaction=False)
    for name in names:
        pipe.llen(f"{NAMESPACE}:{{{name}}}:pending")
        pipe.zcard(f"{NAMESPACE}:{{{name}}}:lease")
    return sum(pipe.execute())


async def drain(tasks: int, count: int, masters: int, workers: int, concurrency: int
                ) -> tuple[float, ...]:
    """(tasks/s, worker CPU µs/task, Redis CPU µs/task, script µs/task, then each master's
    share of the Redis CPU) of one drain of a queue of `count` partitions."""
    servers = Servers(masters)
    queue, names = f"p{count}", partition_names(f"p{count}", count)
    app = obsq.App(NAMESPACE)
    if count > 1:
        app.queue(queue, partitions=count)
    procs: list[subprocess.Popen] = []
    try:
        async with obsq.Client(servers.url, namespace=NAMESPACE, app=app) as client:
            for start in range(0, tasks, 1000):
                await client.enqueue_many([obsq.Job("noop", i, queue=queue)
                                           for i in range(start, min(start + 1000, tasks))])
        async with obsq.Inspector(servers.url, NAMESPACE) as inspector:
            for name in names:
                await inspector.pause(name)
            procs = [start_worker(servers.url, queue, concurrency) for _ in range(workers)]
            await live_workers(inspector, workers)
            cpu = sum(cpu_seconds(p.pid) for p in procs)
            redis_cpu = servers.cpu()
            servers.reset()
            start = time.monotonic()
            for name in names:
                await inspector.unpause(name)
        while await depth(servers, names):
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - start
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu
        used = [after - before for after, before in zip(servers.cpu(), redis_cpu)]
        return (tasks / elapsed, cpu / tasks * 1e6, sum(used) / tasks * 1e6,
                servers.script_usec() / tasks, *(u / sum(used) for u in used))
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
        servers.close()


def report_drains(args: argparse.Namespace, masters: int, counts: tuple[int, ...]) -> None:
    figures: dict[int, list[tuple[float, ...]]] = {c: [] for c in counts}
    for round_ in range(args.rounds):
        order = counts[round_ % len(counts):] + counts[:round_ % len(counts)]
        for count in order:
            figures[count].append(asyncio.run(drain(args.tasks, count, masters, args.workers,
                                                 args.concurrency)))
            print(f"round {round_ + 1} {count} partition(s) {line(figures[count][-1])}  "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    where = f"a Cluster of {masters} masters" if masters else "one Redis"
    print(f"\nmedians of {args.rounds} rounds, {args.tasks:,} no-op tasks, {args.workers} "
          f"worker(s) of concurrency {args.concurrency}, on {where}:")
    for count, runs in figures.items():
        print(f"  {count} partition(s) "
              f"{line([statistics.median(r[i] for r in runs) for i in range(len(runs[0]))])}")


def line(f: tuple[float, ...] | list[float]) -> str:
    shares = " ".join(f"{s:.0%}" for s in f[4:]) if len(f) > 5 else ""
    return (f"{f[0]:8,.0f} tasks/s  worker CPU {f[1]:4.0f} µs/task  Redis CPU {f[2]:5.1f} "
            f"µs/task  scripts {f[3]:5.1f} µs/task" + (f"  masters' shares {shares}"
                                                      if shares else ""))


async def pickup(tasks: int, count: int, masters: int) -> dict[str, list[float]]:
    """Send-to-start times (ms) of `tasks` tasks sent one by one to an idle worker, by the
    partition that held each."""
    servers = Servers(masters)
    queue = f"p{count}"
    app = obsq.App(NAMESPACE)
    if count > 1:
        app.queue(queue, partitions=count)
    record = servers.nodes[0].url
    worker = start_worker(servers.url, queue, OBSQ_WAIT_TIMEOUT="30", BENCH_RECORD_URL=record)
    waits: dict[str, list[float]] = {}
    try:
        async with obsq.Inspector(servers.url, NAMESPACE) as inspector:
            await live_workers(inspector, 1)
        recorder = redis.Redis.from_url(record)
        async with obsq.Client(servers.url, namespace=NAMESPACE, app=app) as client:
            for _ in range(tasks):
                info = await client.enqueue("timed", time.time(), queue=queue)
                while recorder.llen("bench-part:runs") < sum(map(len, waits.values())) + 1:
                    await asyncio.sleep(0.001)
                sent, started = map(float, recorder.lindex("bench-part:runs", -1).split())
                waits.setdefault(info.partition or queue, []).append((started - sent) * 1000)
                await asyncio.sleep(0.02)
        return waits
    finally:
        worker.terminate()
        worker.wait(60)
        servers.close()


async def limited(tasks: int, count: int, keyed: bool) -> tuple[float, int]:
    """(starts a second, most running at once) of a drain of the limited route."""
    servers = Servers()
    queue = f"p{count}"
    app = obsq.App(NAMESPACE)
    if count > 1:
        app.queue(queue, partitions=count)
    worker = start_worker(servers.url, queue, 50, BENCH_RECORD_URL=servers.url)
    try:
        async with obsq.Inspector(servers.url, NAMESPACE) as inspector:
            await live_workers(inspector, 1)
        async with obsq.Client(servers.url, namespace=NAMESPACE, app=app) as client:
            await client.enqueue_many([obsq.Job("limited", i, queue=queue, ordering_key=(
                "one" if keyed else None)) for i in range(tasks)])
        names, most, start = partition_names(queue, count), 0, time.monotonic()
        while int(servers.raw.get("bench-part:limited") or 0) < tasks:
            most = max(most, sum(servers.raw.scard(f"{NAMESPACE}:{{{n}}}:running:limited")
                                 for n in names))
            await asyncio.sleep(0.002)
        return tasks / (time.monotonic() - start), most
    finally:
        worker.terminate()
        worker.wait(60)
        servers.close()


def report_limits(args: argparse.Namespace) -> None:
    for count, keyed in ((1, False), (3, False), (1, True), (3, True)):
        rate, most = asyncio.run(limited(args.tasks, count, keyed))
        how = "all of one ordering key" if keyed else "spread by id"
        print(f"{count} partition(s), {how:23}: {rate:6.1f} starts/s (limit 100/s), at most "
              f"{most} running at once (limit 4)", flush=True)


def report_pickup(args: argparse.Namespace) -> None:
    for masters in (0, 3):
        for count in (1, 3):
            waits = asyncio.run(pickup(args.tasks, count, masters))
            where = f"Cluster of {masters}" if masters else "one Redis"
            for name, ms in sorted(waits.items()):
                ms.sort()
                print(f"{where:14} {count} partition(s) {name:14} {len(ms):4} tasks: send to "
                      f"start median {statistics.median(ms):5.2f} ms, p90 "
                      f"{ms[int(len(ms) * 0.9)]:5.2f} ms, max {ms[-1]:6.2f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("drain", "cluster", "pickup", "limits"))
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    arguments = parser.parse_args()
    if arguments.what == "drain":
        report_drains(arguments, 0, (1, 3, 8))
    elif arguments.what == "cluster":
        report_drains(arguments, 3, (1, 3))
    elif arguments.what == "limits":
        report_limits(arguments)
    else:
        report_pickup(arguments)
