"""obsq.testing's clock over one simulated day of an `@every 5s` schedule: the wall time of
`env.advance(86400)` (17,280 fires, each enqueued and run) on a private redis-server. A
report, never an assertion.

    python tests/bench/testing_day.py              # one day of @every 5s
    python tests/bench/testing_day.py --every 1 --days 2 --profile

It imports the obsq of the checkout it is in: run it from each checkout to compare.
`--profile` prints the cProfile of the advance, the 25 costliest functions by their
cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import obsq
from obsq.testing import Environment


async def day(every: int, days: float, profile: bool) -> None:
    app = obsq.App(namespace="bench-testing")
    runs: list[float] = []

    @app.task("tick")
    async def tick(task: obsq.Task) -> None:
        runs.append(task.payload)

    app.periodic(f"@every {every}s", "tick", 1)
    seconds = days * 86400
    async with Environment(app) as env:
        profiler = cProfile.Profile() if profile else None
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        await env.advance(seconds)
        if profiler:
            profiler.disable()
        took = time.perf_counter() - started
    print(f"@every {every}s over {seconds:g} s of the clock: {len(runs)} runs "
          f"(expected {int(seconds // every)}) in {took:.2f} s of wall time")
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=5, help="the interval, in seconds")
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(day(args.every, args.days, args.profile))


if __name__ == "__main__":
    main()
