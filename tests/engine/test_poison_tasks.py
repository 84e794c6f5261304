"""A task that kills its worker process (os._exit, a native crash, an OOM kill) takes the
tasks running beside it down too. They are taken back as suspects, which run alone; only a
loss during a run alone counts against max_recoveries, so the poison ends dead and every
task that merely ran beside it completes."""

from __future__ import annotations

import time

from support import depth, wait_until

import obsq
from obsq.broker import Broker

from .helpers import decoded, record_key

INNOCENT = 30


async def test_a_poison_task_takes_no_innocent_task_down_with_it(
        client: obsq.Client, broker: Broker, raw_redis, namespace, spawn_worker) -> None:
    jobs = [obsq.Job("sleep", {"first": 1.0, "then": 0.1}, retention=600)
            for _ in range(INNOCENT)]
    jobs.insert(5, obsq.Job("crash", retention=600))
    started = time.monotonic()
    infos = await client.enqueue_many(jobs)
    poison = infos.pop(5)
    worker = spawn_worker("--processes", "2", "--max-recoveries", "2", concurrency=10)

    async def ended() -> list[str] | None:
        states = [(await client.info(i.id)).state for i in [poison, *infos]]
        return states if all(s in ("completed", "dead") for s in states) else None

    states = await wait_until(ended, timeout=300, interval=0.5, what="every task ended")
    elapsed = time.monotonic() - started
    assert states[0] == "dead"
    assert states[1:].count("dead") == 0, f"{states[1:].count('dead')} innocent tasks dead"
    dead = await client.info(poison.id)
    assert dead.error == ("lost its worker 3 times while it ran alone (max_recoveries 2): "
                          "the task kills its worker")
    assert (await depth(broker))["dead"] == 1
    runs = int(raw_redis.get(record_key(namespace, f"attempts:{poison.id}")))
    assert runs == 4, "one run beside others, then three alone"
    innocent_runs = len(decoded(raw_redis.lrange(record_key(namespace, "started"), 0, -1))) \
        - runs
    crashes = worker.log().count("exited with")
    print(f"poison: {runs} runs, {crashes} worker crashes; {INNOCENT} innocent tasks: "
          f"{innocent_runs} runs, all completed; {elapsed:.1f} s in all")
