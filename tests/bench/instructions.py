"""Instructions obsq spends per task, counted by callgrind: a figure a shared machine's load
does not move (the same binary and inputs count the same), for A/B-ing a change of the
per-task path where timings on this host are too noisy to tell a few microseconds apart.

A worker drains `--tasks` no-op (`--what io`: one awaited Redis INCR each) tasks in a
process of its own under `valgrind --tool=callgrind`, twice, with two task counts; the
difference of the two totals over the difference of the counts is the cost of one task,
without start-up and shut-down. Background loops whose cost is per second, not per task
(the forwarder, recoverer, janitor), are slowed down to an hour here: under valgrind a
second is fifty times longer and they would count as the tasks' cost. `--what enqueue`
counts a producer instead: `Client.enqueue` one await at a time (`enqueue-concurrent`:
in gathers of 1,000; `enqueue-many`: `enqueue_many` in chunks of 1,000).

    python tests/bench/instructions.py                      # this checkout, uvloop
    python tests/bench/instructions.py --tree ../other      # another checkout of obsq
    python tests/bench/instructions.py --loop asyncio --what io
    python tests/bench/instructions.py --what enqueue --tree ../other
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import RedisServer, find_redis_server  # noqa: E402

WORKER = r"""
import asyncio, os, sys
import obsq
from obsq.engine.eventloop import run

url, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = obsq.App(namespace="bench")
done = 0
if what == "io":
    import redis.asyncio
    io = redis.asyncio.Redis.from_url(url)

@app.task("job")
async def job(task):
    global done
    if what == "io":
        await io.incr("bench:io")
    done += 1
    if done == n:
        worker.stop()

worker = obsq.Worker(app, redis_url=url, queues={"default": 1}, concurrency=10,
                     handle_signals=False, forward_interval=3600, recover_interval=3600,
                     janitor_interval=3600)
run(worker.run(), os.environ.get("OBSQ_LOOP", "auto"))
"""

PRODUCER = r"""
import asyncio, logging, sys
import obsq

logging.getLogger("obsq").setLevel(logging.ERROR)  # "no live worker serves": none runs
url, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]

async def main():
    client = obsq.Client(url, namespace="bench")
    jobs = [obsq.Job("job", {"i": i}) for i in range(n)]
    for start in range(0, n, 1000):
        chunk = jobs[start:start + 1000]
        if what == "enqueue-many":
            await client.enqueue_many(chunk)
        elif what == "enqueue-concurrent":
            await asyncio.gather(*(client.enqueue(j.type, j.payload) for j in chunk))
        else:
            for job in chunk:
                await client.enqueue(job.type, job.payload)
    await client.close()

asyncio.run(main())
"""


def fill(url: str, n: int) -> None:
    import obsq

    logging.getLogger("obsq").setLevel(logging.ERROR)  # "no live worker serves": none yet

    client = obsq.SyncClient(url, namespace="bench")
    client.enqueue_many([obsq.Job("job", {"i": i}) for i in range(n)])
    client.close()


def count(tree: Path, url: str, n: int, what: str, loop: str) -> int:
    if what in ("noop", "io"):
        fill(url, n)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        # OBSQ_CALL_TIMEOUT: a producer's call under valgrind, fifty times slower on a busy
        # host, may outlive the default 5 s deadline (BrokerTimeout): an hour here
        env = {**os.environ, "PYTHONPATH": str(tree), "OBSQ_LOOP": loop,
               "OBSQ_CALL_TIMEOUT": "3600"}
        code = WORKER if what in ("noop", "io") else PRODUCER
        # run in the scratch directory: `-c` puts the working directory first on the path
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, "-c", code, url, str(n), what],
                       env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=1800)
        totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
        return int(totals.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent.parent,
                        help="the obsq checkout to measure (default: this one)")
    parser.add_argument("--tasks", default="1000,4000",
                        help="the two drain sizes (default 1000,4000)")
    parser.add_argument("--what", choices=["noop", "io", "enqueue", "enqueue-concurrent",
                                           "enqueue-many"], default="noop")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    small, large = (int(n) for n in args.tasks.split(","))
    binary, _ = find_redis_server()
    with RedisServer(binary) as server:
        few = count(args.tree.resolve(), server.url, small, args.what, args.loop)
        server.flush()
        many = count(args.tree.resolve(), server.url, large, args.what, args.loop)
    per_task = (many - few) / (large - small)
    print(f"{args.tree.resolve()} ({args.what}, {args.loop}): {per_task:,.0f} "
          f"instructions per task ({few:,} for {small}, {many:,} for {large})")


if __name__ == "__main__":
    main()
