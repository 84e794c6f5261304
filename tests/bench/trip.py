"""The files one warm task's trip crosses: from `Client.enqueue` to the App's outcome hook.

A worker and a producer share one event loop in this process, on a private Redis. After a
warm-up of 200 tasks (scripts loaded, queues registered, connections open), the profiler
(`sys.setprofile`, every Python function entered) watches the event loop's thread from the
moment `Client.enqueue` is called until the outcome hook of that task runs; the files of
obsq whose functions were entered in that window are the trip. The worker's periodic
sweeps (forwarder, recoverer, janitor) are set to an hour, as in instructions.py, so that
only the task's own path is counted; what the heartbeat thread does meanwhile is not on
the event loop's thread and is not counted.

    python tests/bench/trip.py                  # the plain Worker
    python tests/bench/trip.py --observed       # as `obsq worker` runs it: metrics, tracing
    python tests/bench/trip.py --list           # each file with the calls made into it
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import obsq
from obsq.redis_server import RedisServer

PACKAGE = Path(obsq.__file__).resolve().parent


async def trip(url: str, observed: bool) -> collections.Counter[str]:
    app = obsq.App(namespace="trip")
    ended: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
    calls: collections.Counter[str] = collections.Counter()
    watching = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(str(PACKAGE)):
                calls[str(Path(path).relative_to(PACKAGE.parent))] += 1

    @app.task("job")
    async def job(task: obsq.Task) -> None:
        return None

    def outcome(task: obsq.Task, outcome: str, error: BaseException | None) -> None:
        if watching:
            sys.setprofile(None)
        ended[task.id].set()

    app.on_outcome(outcome)
    worker = obsq.Worker(app, redis_url=url, queues={"default": 1}, concurrency=10,
                         handle_signals=False, forward_interval=3600, recover_interval=3600,
                         janitor_interval=3600)
    if observed:
        from obsq.observability import run_worker
        running = asyncio.create_task(run_worker(worker, http_port=0))
    else:
        running = asyncio.create_task(worker.run())
    client = obsq.Client(url, namespace="trip")
    for _ in range(200):
        info = await client.enqueue("job", {"n": 1})
        await asyncio.wait_for(ended[info.id].wait(), 10)
    await asyncio.sleep(0.2)
    watching = True
    sys.setprofile(profile)
    info = await client.enqueue("job", {"n": 1})
    await asyncio.wait_for(ended[info.id].wait(), 10)
    sys.setprofile(None)
    worker.stop()
    await running
    await client.close()
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--observed", action="store_true",
                        help="run the worker as `obsq worker` does (metrics, tracing, HTTP)")
    parser.add_argument("--list", action="store_true", help="print each file and its calls")
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        calls = asyncio.run(trip(server.url, args.observed))
    finally:
        server.close()
    if args.list:
        for path, count in sorted(calls.items()):
            print(f"{count:6d}  {path}")
    print(f"one warm task's trip: {len(calls)} obsq files, {sum(calls.values())} calls")


if __name__ == "__main__":
    main()
