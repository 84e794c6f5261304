"""The App of tests/bench/partitions.py, run by `obsq worker partition_app:app` from this
folder: queue `p<N>` has N partitions."""

import os
import time

from redis.asyncio import Redis

import obsq

app = obsq.App(namespace="bench-part")
for count in (3, 8):
    app.queue(f"p{count}", partitions=count)
_redis: list[Redis] = []


@app.task("noop", queue="p1")
async def noop(task: obsq.Task) -> None:
    """Returns at once: what a drain of it measures is obsq."""


@app.task("limited", queue="p1", rate_limit="100/s", concurrency=4)
async def limited(task: obsq.Task) -> None:
    """Its route starts at most 100 a second and runs at most 4 at once, across workers;
    counts its runs."""
    await recorder().incr("bench-part:limited")


def recorder() -> Redis:
    if not _redis:
        _redis.append(Redis.from_url(os.environ["BENCH_RECORD_URL"]))
    return _redis[0]


@app.task("timed", queue="p1")
async def timed(task: obsq.Task) -> None:
    """Records when its producer sent it and when it started (the same host's clock)."""
    await recorder().rpush("bench-part:runs", f"{task.payload:.6f} {time.time():.6f}")
