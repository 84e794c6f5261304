"""Instructions obsq spends per task, counted by callgrind: a figure a shared machine's load
does not move (the same binary and inputs count the same), for A/B-ing a change of the
per-task path where timings on this host are too noisy to tell a few microseconds apart.

A worker drains `--tasks` no-op (`--what io`: one awaited Redis INCR each) tasks in a
process of its own under `valgrind --tool=callgrind`, twice, with two task counts; the
difference of the two totals over the difference of the counts is the cost of one task,
without start-up and shut-down. Background loops whose cost is per second, not per task
(the forwarder, recoverer, janitor), are slowed down to an hour here: under valgrind a
second is fifty times longer and they would count as the tasks' cost. `--what limited`
drains no-op tasks of a route limited to 3 at once (`concurrency=3`): most fetches hold
tasks back, and each end lets one out. `--what enqueue` counts a producer instead:
`Client.enqueue` one await at a time (`enqueue-concurrent`: in gathers of 1,000;
`enqueue-many`: `enqueue_many` in chunks of 1,000).

`--side redis` counts the redis-server instead, under callgrind from the end of the fill
to its shutdown, while the worker (or producer) runs as usual: what the scripts cost Redis
per task.

    python tests/bench/instructions.py                      # this checkout, uvloop
    python tests/bench/instructions.py --tree ../other      # another checkout of obsq
    python tests/bench/instructions.py --loop asyncio --what io
    python tests/bench/instructions.py --what enqueue --tree ../other
    python tests/bench/instructions.py --what limited --side redis
    python tests/bench/instructions.py --what enqueue --side redis --tasks 500,1500
    python tests/bench/instructions.py --metrics both       # + Prometheus and OTel metrics
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import redis  # noqa: E402
from harness import RedisServer, find_redis_server, free_port  # noqa: E402

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

@app.task("job", concurrency=3 if what == "limited" else None)
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
if os.environ.get("BENCH_METRICS"):
    import obsq.observability
    if os.environ.get("OTEL_METRICS_EXPORTER"):
        assert obsq.observability.setup_otel_metrics()
    obsq.observability.instrument_app(app, metrics=True, tracing=False, concurrency=10,
                                      queues=["default"])
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


DRAINS = ("noop", "io", "limited")
# --metrics: the worker's App uninstrumented, with Prometheus's metrics, or with them and the
# OTel messaging metrics too (pushed every hour to nowhere: the recording is what counts)
METRICS = {"none": {}, "prometheus": {"BENCH_METRICS": "1"},
           "both": {"BENCH_METRICS": "1", "OTEL_METRICS_EXPORTER": "otlp",
                    "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
                    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}}


def count(tree: Path, url: str, n: int, what: str, loop: str, metrics: str) -> int:
    if what in DRAINS:
        fill(url, n)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        # OBSQ_CALL_TIMEOUT: a producer's call under valgrind, fifty times slower on a busy
        # host, may outlive the default 5 s deadline (BrokerTimeout): an hour here
        env = {**os.environ, "PYTHONPATH": str(tree), "OBSQ_LOOP": loop,
               "OBSQ_CALL_TIMEOUT": "3600", **METRICS[metrics]}
        code = WORKER if what in DRAINS else PRODUCER
        # run in the scratch directory: `-c` puts the working directory first on the path
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, "-c", code, url, str(n), what],
                       env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=1800)
        return _total(out)


def count_redis(tree: Path, binary: str, n: int, what: str, loop: str) -> int:
    """The instructions of a redis-server of its own while a worker (not under valgrind)
    drains `n` tasks, or a producer enqueues them: counted from the end of the fill
    (callgrind_control --zero) to the server's shutdown; `--hz 1`, so that its cron, which
    runs by the second, counts little."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--hz", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    time.sleep(0.2)
            if what in DRAINS:
                fill(url, n)
            subprocess.run(["callgrind_control", "--zero", str(server.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env = {**os.environ, "PYTHONPATH": str(tree), "OBSQ_LOOP": loop,
                   "OBSQ_CALL_TIMEOUT": "3600"}
            code = WORKER if what in DRAINS else PRODUCER
            subprocess.run([sys.executable, "-c", code, url, str(n), what], env=env,
                           cwd=tmp, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=1800)
            client.shutdown(nosave=True)
        except redis.ConnectionError:  # the shutdown's connection closing
            pass
        finally:
            client.close()
            server.wait(120)
        return _total(out)


def _total(out: Path) -> int:
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    return int(totals.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE.parent.parent,
                        help="the obsq checkout to measure (default: this one)")
    parser.add_argument("--tasks", default="1000,4000",
                        help="the two drain sizes (default 1000,4000)")
    parser.add_argument("--what", choices=[*DRAINS, "enqueue", "enqueue-concurrent",
                                           "enqueue-many"], default="noop")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--metrics", choices=list(METRICS), default="none",
                        help="a drain's worker without metrics (default), with Prometheus's, "
                        "or with the OTel messaging metrics recorded too")
    parser.add_argument("--side", choices=["worker", "redis"], default="worker",
                        help="whose instructions: the worker's (or producer's), or Redis's")
    args = parser.parse_args()
    small, large = (int(n) for n in args.tasks.split(","))
    binary, _ = find_redis_server()
    tree = args.tree.resolve()
    if args.side == "redis":
        few, many = (count_redis(tree, binary, n, args.what, args.loop)
                     for n in (small, large))
    else:
        with RedisServer(binary) as server:
            few = count(tree, server.url, small, args.what, args.loop, args.metrics)
            server.flush()
            many = count(tree, server.url, large, args.what, args.loop, args.metrics)
    per_task = (many - few) / (large - small)
    print(f"{tree} ({args.what}, {args.loop}, {args.side}, metrics {args.metrics}): "
          f"{per_task:,.0f} "
          f"instructions per task ({few:,} for {small}, {many:,} for {large})")


if __name__ == "__main__":
    main()
