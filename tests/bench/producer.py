"""Producer throughput alone: obsq's four enqueue paths, each on its own private
redis-server, a few rounds. A report, never an assertion.

    python tests/bench/producer.py                 # 3 rounds of 5,000 tasks a path
    python tests/bench/producer.py --rounds 5 --tasks 20000

To compare two versions of obsq, run this file from each checkout in turn (the child
processes import the obsq of the checkout the script is in), alternating, so that both
see the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, RedisServer, find_redis_server
from run import enqueue

PATHS = (("single", "Client.enqueue, one await at a time"),
         ("sync", "SyncClient.enqueue, one at a time"),
         ("concurrent", "1,000 concurrent Client.enqueue"),
         ("bulk", "enqueue_many, chunks of 1,000"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=5000, help="tasks per path and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--redis-server", help="redis-server binary (default: newest on PATH)")
    args = p.parse_args()
    binary, version = find_redis_server(args.redis_server)
    print(f"obsq producer benchmark  obsq from {REPO}  redis-server {version}")
    rates: dict[str, list[float]] = {mode: [] for mode, _ in PATHS}
    for _ in range(args.rounds):
        for mode, _ in PATHS:
            with RedisServer(binary) as rs:
                rates[mode].append(enqueue("obsq", rs, args.tasks, mode)["rate"])
    for mode, label in PATHS:
        runs = ", ".join(f"{r:,.0f}" for r in rates[mode])
        print(f"{label:40} median {statistics.median(rates[mode]):>9,.0f} tasks/s  ({runs})")


if __name__ == "__main__":
    main()
