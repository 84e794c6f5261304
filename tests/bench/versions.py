"""Two versions of obsq on one Redis, as a rolling deploy runs them: the producer of one
version and the worker of the other, both ways. Each task is enqueued with one of the
options below; an option the producer's version does not know is left out (said in the
report). A task the older worker does not serve (an option newer than it) must wait, not
be lost: a worker of the newer version started afterwards runs it. Every task is to run
exactly once.

    python tests/bench/versions.py                   # against the bench's default ref
    python tests/bench/versions.py --ref 2e5b067 --tasks 400
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import baseline, default_ref  # noqa: E402
from harness import REPO, RedisServer, find_redis_server  # noqa: E402

# the options the tasks are given in turn, by name
OPTIONS = {"plain": {}, "delay": {"delay": 0.2}, "unique": {"unique_for": 30},
           "ordering": {"ordering_key": "k"}, "own id": {"task_id": "own-{i}"},
           "priority": {"priority": 3}, "fairness": {"fairness_key": "tenant"},
           "expires": {"expires": 600}}

CHILD = r"""
import asyncio, json, logging, sys
import obsq

logging.getLogger("obsq").setLevel(logging.ERROR)
role, url, n, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
app = obsq.App(namespace="versions")
ran = []

@app.task("job")
async def job(task):
    ran.append(task.payload["i"])

async def produce():
    client = obsq.Client(url, namespace="versions")
    unknown = set()
    for i in range(n):
        name = list(options)[i % len(options)]
        given = {k: v.format(i=i) if isinstance(v, str) else v
                 for k, v in options[name].items()}
        try:
            await client.enqueue("job", {"i": i, "option": name}, **given)
        except TypeError:  # an option this version has not
            unknown.add(name)
            await client.enqueue("job", {"i": i, "option": name})
    await client.close()
    print(json.dumps(sorted(unknown)))

async def work(idle):
    worker = obsq.Worker(app, redis_url=url, queues={"default": 1}, concurrency=10,
                         handle_signals=False)
    running = asyncio.ensure_future(worker.run())
    seen, quiet = 0, 0.0
    while quiet < idle:  # until no task has run for `idle` seconds
        await asyncio.sleep(0.1)
        quiet = 0.0 if len(ran) > seen else quiet + 0.1
        seen = len(ran)
    worker.stop()
    await running
    print(json.dumps(ran))

asyncio.run(produce() if role == "produce" else work(float(role.split(":")[1])))
"""


def child(obsq_from: Path, role: str, url: str, n: int) -> object:
    env = {**os.environ, "PYTHONPATH": str(obsq_from)}
    done = subprocess.run([sys.executable, "-c", CHILD, role, url, str(n), json.dumps(OPTIONS)],
                          env=env, cwd=HERE, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{role} ({obsq_from}) failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def trial(producer: tuple[str, Path], worker: tuple[str, Path], n: int, binary: str) -> bool:
    """One direction: `producer`'s Client enqueues, `worker`'s Worker drains; then a worker of
    this checkout (the newer version) runs whatever waited."""
    with RedisServer(binary) as server:
        unknown = child(producer[1], "produce", server.url, n)
        first = child(worker[1], "work:3", server.url, n)
        later = child(REPO, "work:3", server.url, n) if len(first) < n else []
    names = list(OPTIONS)
    runs = Counter([*first, *later])
    waited = Counter(names[i % len(names)] for i in later)
    lost = [i for i in range(n) if i not in runs]
    twice = [i for i, c in runs.items() if c > 1]
    print(f"{producer[0]} producer -> {worker[0]} worker: {len(first)} of {n} ran"
          + (f"; options the producer has not: {', '.join(unknown)}" if unknown else "")
          + ("; waited for a worker of this checkout: "
             + ", ".join(f"{k} {v}" for k, v in sorted(waited.items())) if later else "")
          + f"; lost {len(lost)}, ran twice {len(twice)}")
    return not lost and not twice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="the other version (default: the bench's default ref)")
    parser.add_argument("--tasks", type=int, default=200)
    args = parser.parse_args()
    ref = args.ref or default_ref()
    other = ("obsq@" + ref, baseline(ref).obsq_from)
    this = ("this checkout", REPO)
    binary, _ = find_redis_server()
    ok = [trial(other, this, args.tasks, binary), trial(this, other, args.tasks, binary)]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
