"""Plain handlers that overrun their timeout (a report, no asserts), with the handlers of
tests/engine/pool_apps.py in one `obsq worker` process on a private Redis:

    python tests/bench/overrun.py [--pool thread|process] [--obsq DIR]

1. starvation: concurrency 3; 6 plain handlers in time.sleep(40) with timeout=1 (default
   retries), then 10 quick plain tasks (timeout=2): how many of the 10 complete, and when
   the last one ends after the first was enqueued (given up after --patience seconds);
2. stopping: 3 plain handlers hung in time.sleep(1000) (one with timeout=1, so that its
   thread is abandoned first), then SIGTERM with a shutdown timeout of 1 s: how long until
   the process exits (killed after --patience seconds), and how many tasks went back to
   pending.

`--obsq DIR` runs the worker on the obsq found in DIR (an export of another commit:
`git archive REV obsq | tar -x -C DIR`); without --pool no flag is passed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support import short_interval_env  # noqa: E402

import obsq  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NS = "bench-overrun"


def start_worker(args: argparse.Namespace, url: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
    env |= short_interval_env() | {"OBSQ_ENGINE_RECORD_URL": url, "PYTHONPATH": str(ROOT),
                                   "OBSQ_ENGINE_RECORD_PREFIX": NS}
    pool = ["--pool", args.pool] if args.pool else []
    worker = subprocess.Popen(  # `python -m` imports obsq from its working directory first
        [sys.executable, "-m", "obsq", "worker", "tests.engine.pool_apps:app", "--redis-url",
         url, "--namespace", NS, "--http-port", "-1", "--no-metrics", "--no-tracing",
         "--concurrency", "3", *pool, *extra], cwd=args.obsq or ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    raw = redis.Redis.from_url(url)
    while not raw.keys(f"{NS}:worker:*"):
        time.sleep(0.05)
    return worker


async def starvation(args: argparse.Namespace) -> None:
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    worker = start_worker(args, server.url)
    try:
        async with obsq.Client(server.url, namespace=NS) as client:
            for _ in range(6):
                await client.enqueue("sleep", 40, queue="default", timeout=1)
            while raw.llen(f"{NS}:rec:started") < 3:
                await asyncio.sleep(0.05)
            start = time.monotonic()
            ids = [(await client.enqueue("quick", i, timeout=2, retention=600)).id
                   for i in range(10)]
            while time.monotonic() - start < args.patience:
                states = [(await client.info(i)).state for i in ids]
                if all(s in ("completed", "dead") for s in states):
                    break
                await asyncio.sleep(0.02)
            print(f"starvation: {states.count('completed')} of 10 quick plain tasks completed, "
                  f"{states.count('dead')} dead, {time.monotonic() - start:.2f} s after the "
                  "first was enqueued")
    finally:
        worker.kill()
        worker.wait()
        server.close()


async def stopping(args: argparse.Namespace) -> None:
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    worker = start_worker(args, server.url, "--shutdown-timeout", "1")
    try:
        async with obsq.Client(server.url, namespace=NS) as client:
            await client.enqueue("sleep", 1000, queue="default", timeout=1, max_retry=0)
            for _ in range(2):
                await client.enqueue("sleep", 1000, queue="default", timeout=1000)
            while raw.llen(f"{NS}:rec:started") < 3:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)  # the first overran its timeout: its thread abandoned
        start = time.monotonic()
        worker.terminate()
        try:
            worker.wait(args.patience)
            ended = f"exited {time.monotonic() - start:.2f} s after SIGTERM"
        except subprocess.TimeoutExpired:
            ended = f"still running {args.patience:g} s after SIGTERM (killed)"
        print(f"stopping: shutdown timeout 1 s, {ended}, "
              f"{raw.llen(f'{NS}:{{default}}:pending')} task(s) back in pending")
    finally:
        worker.kill()
        worker.wait()
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", choices=("thread", "process"))
    parser.add_argument("--obsq", metavar="DIR", help="run the worker on the obsq in DIR")
    parser.add_argument("--patience", type=float, default=60.0)
    arguments = parser.parse_args()
    asyncio.run(starvation(arguments))
    asyncio.run(stopping(arguments))
