"""Figures of task groups and fan-out events across worker processes (a report, no
asserts): three `obsq worker tests.engine.fanout_apps:app` processes on a private Redis.

    python tests/bench/fanout.py [--rows 650] [--events 300] [--workers 3]

Groups: `--rows` grouped tasks over 7 groups (max_size 10, grace_period 0.3 s), enqueued
at once; reported: the batches made, and how long after the last enqueue the last
aggregated task ran. Events: `--events` events published one after another to three
subscribers (one of which fails each copy twice before it succeeds); reported: the publish
rate, and how long after the last publish the last copy was handled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support import short_interval_env  # noqa: E402

import obsq  # noqa: E402
from obsq.redis_server import RedisServer  # noqa: E402

NAMESPACE = "bench-fanout"


def record(name: str) -> str:
    return f"{NAMESPACE}:rec:{name}"


async def wait(condition, timeout: float = 120.0) -> float:
    """Poll until `condition()`; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        await asyncio.sleep(0.005)
    return time.monotonic()


async def main(args: argparse.Namespace) -> None:
    server = RedisServer().start()
    raw = redis.Redis.from_url(server.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
    env |= short_interval_env() | {"OBSQ_ENGINE_RECORD_URL": server.url, "PYTHONPATH": str(ROOT),
                                   "OBSQ_ENGINE_RECORD_PREFIX": NAMESPACE}
    workers = [subprocess.Popen(
        [sys.executable, "-m", "obsq", "worker", "tests.engine.fanout_apps:app",
         "--redis-url", server.url, "--namespace", NAMESPACE, "--http-port", "-1",
         "--no-metrics", "--no-tracing", "--concurrency", "10"], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(args.workers)]
    try:
        await wait(lambda: len(raw.keys(f"{NAMESPACE}:worker:*")) == args.workers, 60)
        async with obsq.Client(server.url, namespace=NAMESPACE) as client:
            await wait(lambda: raw.zcard(f"{NAMESPACE}:{{events}}:sub:order.created") == 3)
            start = time.monotonic()
            await asyncio.gather(*(client.enqueue("ingest:row", n, group=f"g{n % 7}")
                                   for n in range(args.rows)))
            enqueued = time.monotonic()

            def aggregated() -> bool:
                runs = [orjson.loads(r) for r in raw.lrange(record("batches"), 0, -1)]
                return len({i for r in runs for i in r["ids"]}) == args.rows
            done = await wait(aggregated)
            batches = len({orjson.loads(r)["id"] for r in raw.lrange(record("batches"), 0, -1)})
            print(f"groups: {args.rows} grouped tasks in 7 groups over {args.workers} workers: "
                  f"enqueued in {enqueued - start:.2f} s, {batches} batches, the last "
                  f"aggregated task ran {done - enqueued:.2f} s after the last enqueue")

            start = time.monotonic()
            for n in range(args.events):
                await client.publish("order.created", {"n": n}, event_id=f"e{n}")
            published = time.monotonic()
            done = await wait(lambda: raw.llen(record("delivered")) >= 3 * args.events)
            print(f"events: {args.events} events to 3 subscribers (one failing twice per "
                  f"copy): {args.events / (published - start):.0f} publishes/s, the last "
                  f"copy handled {done - published:.2f} s after the last publish "
                  f"({raw.llen(record('delivered'))} copies handled)")
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
        server.close()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=650)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--workers", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
