"""obsq's chaos suite: each scenario breaks something real (workers, Redis, its memory,
its clock) under load and counts what was lost.

    pip install -e . --group test                      # what the harness imports
    python tests/chaos/run.py                          # every scenario, long version
    python tests/chaos/run.py --quick                  # every scenario, short version
    python tests/chaos/run.py --scenario failover      # one of them
    python tests/chaos/run.py --scenario workers --tasks 20000 --quick

A report: it prints the redis-server it runs (the newest on PATH), then, per scenario,
the tasks enqueued (acknowledged by Redis), completed, lost, run to the end more than
once, and the recovery time (harness.py defines each), and exits 1 when a scenario that
promises no loss lost a task. The short versions run in the test suite
(tests/chaos/test_chaos.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from chaos.harness import HEADER, Outcome, redis_server_executable  # noqa: E402
from chaos.scenarios import SCENARIOS  # noqa: E402

# tasks of the long version, per scenario
TASKS = {"workers": 100_000, "redis-restart": 10_000, "failover": 10_000, "hang": 10_000,
         "full": 50_000, "skew": 5_000, "blocked-loop": 2_000}
# scenarios whose loss is not a failure: the Redis settings that do not promise it
REFERENCE = ("appendonly no", "durable_replicas=0", "appendfsync everysec")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append",
                        help="run only this one (may be repeated)")
    parser.add_argument("--tasks", type=int, help="tasks per scenario (default: per scenario)")
    parser.add_argument("--quick", action="store_true",
                        help="the short version: short heartbeat intervals and faults")
    args = parser.parse_args()
    outcomes: list[Outcome] = []
    try:
        executable = redis_server_executable()
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:  # none new enough
        print(exc, file=sys.stderr)
        return 2
    version = subprocess.run([executable, "--version"], capture_output=True, text=True)
    print(f"{executable}: {version.stdout.strip()}; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    print(HEADER, flush=True)
    for name in args.scenario or list(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix=f"obsq-chaos-{name}-") as workdir:
            began = time.monotonic()
            try:
                results = await SCENARIOS[name](args.tasks or TASKS[name], Path(workdir),
                                                args.quick)
            except FileNotFoundError as exc:
                print(f"{name:<38} not run: {exc}", flush=True)
                continue
            for result in results:
                print(result.row(), flush=True)
                for key, value in result.notes.items():
                    print(f"{'':<4}{key.replace('_', ' ')}: {value}", flush=True)
            print(f"{'':<4}({time.monotonic() - began:.0f} s)", flush=True)
            outcomes += results
    failed = [o.scenario for o in outcomes
              if o.lost and not any(r in o.scenario for r in REFERENCE)]
    if failed:
        print(f"lost tasks in: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
