"""The App of tests/bench/priority.py, run by `obsq worker priority_app:app` from this folder
(so any obsq on PYTHONPATH can run it)."""

import asyncio
import os
import time

from redis.asyncio import Redis

import obsq

app = obsq.App(namespace="bench-prio")
_redis: list[Redis] = []


@app.task("noop")
async def noop(task: obsq.Task) -> None:
    """Returns at once: what a drain of it measures is obsq."""


@app.task("timed")
async def timed(task: obsq.Task) -> None:
    """Records its priority, when its producer sent it and when it starts (the same host's
    clock), then takes payload["s"] seconds."""
    if not _redis:
        _redis.append(Redis.from_url(os.environ["BENCH_REDIS_URL"]))
    await _redis[0].rpush("bench-prio:runs",
                          f"{task.payload['p']} {task.payload['t']:.4f} {time.time():.4f}")
    await asyncio.sleep(task.payload["s"])
