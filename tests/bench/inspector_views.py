"""What reading a partitioned queue costs an operator (a report, no asserts).

    python tests/bench/inspector_views.py [--tasks 30000] [--rounds 200]

On one private Redis, queues of the same depth (pending tasks, and as many scheduled)
stored as 1, 3 and 16 partitions; in each round every queue is read the same ways, the
queues interleaved, so a load that comes and goes hits them alike: the Inspector's queue
figures (`queue`), a page of 25 pending tasks at the start and deep in the queue
(`page@0`, `page@mid`), a page filtered by type, and a task by id through the queue's name
(`task`). Prints the median milliseconds of each, and each against the one-partition
queue's."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]

import obsq  # noqa: E402
from obsq.inspection.inspector import Inspector  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench-views"
COUNTS = (1, 3, 16)


async def fill(url: str, tasks: int) -> dict[int, list[str]]:
    """Each queue `q<n>` of n partitions: `tasks` pending (types a and b) and as many
    scheduled; returns some of each queue's ids."""
    app = obsq.App(namespace=NAMESPACE)
    ids: dict[int, list[str]] = {}
    async with obsq.Client(url, app=app) as client:
        for n in COUNTS:
            app.queue(f"q{n}", partitions=n)
            for start in range(0, tasks, 1000):
                infos = await client.enqueue_many([
                    obsq.Job("bench:a" if i % 10 else "bench:b", i, queue=f"q{n}")
                    for i in range(start, min(start + 1000, tasks))])
                await client.enqueue_many([obsq.Job("bench:later", i, queue=f"q{n}",
                                                    delay=3600)
                                           for i in range(start, min(start + 1000, tasks))])
                ids.setdefault(n, []).extend(i.id for i in infos[::100])
    return ids


async def measure(url: str, tasks: int, rounds: int) -> dict[tuple[str, int], list[float]]:
    ids = await fill(url, tasks)
    times: dict[tuple[str, int], list[float]] = {}
    async with Inspector(url, NAMESPACE) as inspector:
        for r in range(rounds):
            for n in COUNTS:
                queue, task_id = f"q{n}", ids[n][r % len(ids[n])]
                for name, read in reads(inspector, queue, task_id, tasks // 2).items():
                    started = time.perf_counter()
                    await read
                    times.setdefault((name, n), []).append(time.perf_counter() - started)
    return times


def reads(inspector: Inspector, queue: str, task_id: str, middle: int
          ) -> dict[str, Awaitable[object]]:
    """Each read, not started yet."""
    return {"queue": inspector.queue(queue),
            "page@0": inspector.tasks(queue, "pending", 25),
            "page@mid": inspector.tasks(queue, "pending", 25, middle),
            "page type=bench:b": inspector.tasks(queue, "pending", 25, type="bench:b"),
            "task": inspector.task(task_id, queue)}


def report(times: dict[tuple[str, int], list[float]]) -> None:
    names = list(dict.fromkeys(name for name, _ in times))
    print(f"{'read':<20}" + "".join(f"{f'{n} partition(s)':>22}" for n in COUNTS))
    for name in names:
        base = statistics.median(times[name, 1])
        cells = []
        for n in COUNTS:
            ms = statistics.median(times[name, n]) * 1000
            cells.append(f"{ms:8.3f} ms" + (f" ({ms / base / 1000:4.1f}x)" if n > 1 else
                                               " " * 8))
        print(f"{name:<20}" + "".join(f"{c:>22}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=30_000, help="pending tasks a queue")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        times = asyncio.run(measure(server.url, args.tasks, args.rounds))
    finally:
        server.close()
    print(f"{args.tasks:,} pending and {args.tasks:,} scheduled tasks a queue, "
          f"{args.rounds} rounds, median of each read")
    report(times)


if __name__ == "__main__":
    main()
