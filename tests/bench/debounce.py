"""What debouncing costs Redis: 10,000 tasks enqueued in batches of 100 (`enqueue_many`) on a
private redis-server, Redis's time in enqueue.lua per task (INFO commandstats, evalsha),
plain and debounced over 100 keys (each key's first enqueue creates its task, the other 99
replace it). A report, never an assertion.

    python tests/bench/debounce.py            # 5 rounds of each
    python tests/bench/debounce.py --rounds 9

It imports the obsq of the checkout it is in: run it from another checkout to compare the
plain figure with that version's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, RedisServer, find_redis_server

sys.path.insert(0, str(REPO))

import redis

import obsq

TASKS, BATCH, KEYS = 10_000, 100, 100


def job(n: int, debounced: bool) -> obsq.Job:
    if debounced:
        return obsq.Job("t", {"n": n}, debounce_key=f"k{n % KEYS}", debounce=600)
    return obsq.Job("t", {"n": n})


async def redis_us_per_task(url: str, debounced: bool) -> float:
    async with obsq.Client(url, namespace="bench", allow_eviction=True) as client:
        await client.enqueue_many([job(-1, False)])  # scripts loaded, the queue registered
        r = redis.Redis.from_url(url)
        r.config_resetstat()
        for start in range(0, TASKS, BATCH):
            await client.enqueue_many([job(n, debounced) for n in range(start, start + BATCH)])
        usec = r.info("commandstats")["cmdstat_evalsha"]["usec"]
        r.close()
    return usec / TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    binary, version = find_redis_server()
    print(f"redis-server {version}, {TASKS:,} tasks in batches of {BATCH}, {KEYS} keys")
    for debounced in (False, True):
        figures = []
        for _ in range(args.rounds):
            with RedisServer(binary) as server:
                figures.append(asyncio.run(redis_us_per_task(server.url, debounced)))
        print(f"{'debounced' if debounced else 'plain':>9}: Redis µs per task, median "
              f"{statistics.median(figures):.2f} ({', '.join(f'{f:.2f}' for f in figures)})")


if __name__ == "__main__":
    main()
