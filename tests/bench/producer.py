"""Producer cost alone: obsq's four enqueue paths against a private redis-server, each
measured in this process as tasks/s and as the producer's own CPU time per task (the
figure a shared machine disturbs least). A report, never an assertion.

    python tests/bench/producer.py                  # 5 rounds of 3,000 tasks a path
    python tests/bench/producer.py --rounds 7 --tasks 10000
    python tests/bench/producer.py --stopped-redis  # calls on a Redis stopped by SIGSTOP
    python tests/bench/producer.py --stopped-redis --callers 2000

It imports the obsq of the checkout it is in: to compare two versions, run it from each
checkout in turn, alternating, so that both see the same load; the best round of each
path is shown, and every round's figure after it.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, RedisServer, find_redis_server

sys.path.insert(0, str(REPO))

import obsq

CONCURRENT = 1000


async def client_paths(url: str, n: int) -> dict[str, tuple[float, float]]:
    client = obsq.Client(url, "bench", app=obsq.App(namespace="bench"))
    await client.enqueue("t", -1)  # the queue registered, the script loaded

    async def single() -> None:
        for i in range(n):
            await client.enqueue("t", i)

    async def concurrent() -> None:
        for start in range(0, n, CONCURRENT):
            await asyncio.gather(*(client.enqueue("t", i)
                                   for i in range(start, min(n, start + CONCURRENT))))

    async def bulk() -> None:
        for start in range(0, n, 1000):
            await client.enqueue_many([obsq.Job("t", i)
                                       for i in range(start, min(n, start + 1000))])

    figures = {}
    for name, path in (("single", single), ("concurrent", concurrent), ("bulk", bulk)):
        wall, cpu = time.perf_counter(), time.process_time()
        await path()
        figures[name] = (time.perf_counter() - wall, time.process_time() - cpu)
    await client.close()
    return figures


def sync_path(url: str, n: int) -> tuple[float, float]:
    with obsq.SyncClient(url, "bench", app=obsq.App(namespace="bench")) as client:
        client.enqueue("t", -1)
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            client.enqueue("t", i)
        return time.perf_counter() - wall, time.process_time() - cpu


async def stopped_redis(rs: RedisServer, callers: int) -> None:
    """With the default deadline: how long `callers` concurrent producers wait on a Redis
    that stopped answering, what they get, and how soon they work again once it answers."""
    client = obsq.Client(rs.url, "bench", app=obsq.App(namespace="bench"))
    sync_client = obsq.SyncClient(rs.url, "bench", app=obsq.App(namespace="bench"))
    await client.enqueue("t", 0)
    sync_client.enqueue("t", 0)
    assert rs.proc is not None
    os.kill(rs.proc.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        ends = await asyncio.gather(*(client.enqueue("t", i) for i in range(callers)),
                                    return_exceptions=True)
        print(f"{callers:,} concurrent Client.enqueue ended after "
              f"{time.monotonic() - start:.2f} s: "
              f"{', '.join(sorted({type(e).__name__ for e in ends}))}")
        with concurrent.futures.ThreadPoolExecutor(20) as threads:
            start = time.monotonic()
            calls = [threads.submit(sync_client.enqueue, "t", i) for i in range(20)]
            errors = {type(call.exception()).__name__ for call in calls}
        print(f"20 threads' SyncClient.enqueue ended after {time.monotonic() - start:.2f} s: "
              f"{', '.join(sorted(errors))}")
    finally:
        os.kill(rs.proc.pid, signal.SIGCONT)
    start = time.monotonic()
    await client.enqueue("t", "after")
    middle = time.monotonic()
    sync_client.enqueue("t", "after")
    print(f"once Redis answers again: the next Client.enqueue took "
          f"{(middle - start) * 1e3:.1f} ms, the next SyncClient.enqueue "
          f"{(time.monotonic() - middle) * 1e3:.1f} ms")
    sync_client.close()
    await client.close()


PATHS: dict[str, str] = {
    "single": "Client.enqueue, one await at a time",
    "sync": "SyncClient.enqueue, one at a time",
    "concurrent": f"{CONCURRENT:,} concurrent Client.enqueue",
    "bulk": "enqueue_many, chunks of 1,000",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=3000, help="tasks per path and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--redis-server", help="redis-server binary (default: newest on PATH)")
    p.add_argument("--stopped-redis", action="store_true",
                   help="only: producer calls on a Redis stopped by SIGSTOP, then SIGCONT")
    p.add_argument("--callers", type=int, default=200,
                   help="--stopped-redis: concurrent Client.enqueue calls (default 200)")
    args = p.parse_args()
    binary, version = find_redis_server(args.redis_server)
    if args.stopped_redis:
        with RedisServer(binary) as rs:
            asyncio.run(stopped_redis(rs, args.callers))
        return
    print(f"obsq producer benchmark  obsq from {REPO}  redis-server {version}  "
          f"{args.rounds} rounds of {args.tasks:,} tasks")
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in PATHS}
    for _ in range(args.rounds):
        with RedisServer(binary) as rs:
            for name, figure in asyncio.run(client_paths(rs.url, args.tasks)).items():
                rounds[name].append(figure)
            rounds["sync"].append(sync_path(rs.url, args.tasks))
    for name, label in PATHS.items():
        walls = [args.tasks / wall for wall, _ in rounds[name]]
        cpus = [cpu * 1e6 / args.tasks for _, cpu in rounds[name]]
        print(f"{label:38} {max(walls):>8,.0f} tasks/s  {min(cpus):6.1f} us CPU/task  "
              f"(rounds: {', '.join(f'{w:,.0f}' for w in walls)} tasks/s)")


if __name__ == "__main__":
    main()
