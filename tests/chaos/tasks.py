"""The App the chaos suite's worker processes run:

    python -m obsq worker tests.chaos.tasks:app --namespace NS --redis-url URL ...

Each attempt writes two lines to a ledger file of its own process in the directory
$OBSQ_CHAOS_LEDGER, outside the Redis under test (which may lose data):
`S <task number> <time> <pid>` when it begins and `C ...` when it ends. The time is
CLOCK_MONOTONIC, one clock for every process of the machine (a worker under `faketime`
keeps the real one: FAKETIME_DONT_FAKE_MONOTONIC). Small appends to an O_APPEND file are
whole and survive a SIGKILL of the writer."""

from __future__ import annotations

import asyncio
import os
import time

import obsq

app = obsq.App(namespace="chaos")
WORK_SECONDS = float(os.environ.get("OBSQ_CHAOS_WORK_SECONDS", "0.005"))
# The blocked-loop scenario: every BLOCK_EVERY-th task blocks the event loop for
# BLOCK_SECONDS on its first attempt (a sync call in an async def); tasks time out after
# TIMEOUT seconds (unset: the default).
BLOCK_EVERY = int(os.environ.get("OBSQ_CHAOS_BLOCK_EVERY", "0"))
BLOCK_SECONDS = float(os.environ.get("OBSQ_CHAOS_BLOCK_SECONDS", "0"))
TIMEOUT = float(os.environ["OBSQ_CHAOS_TIMEOUT"]) if os.environ.get("OBSQ_CHAOS_TIMEOUT") \
    else None
_ledger: int | None = None


def record(kind: str, number: int) -> None:
    global _ledger
    if _ledger is None:
        path = os.path.join(os.environ["OBSQ_CHAOS_LEDGER"], f"{os.getpid()}.log")
        _ledger = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_ledger, f"{kind} {number} {time.monotonic():.4f} {os.getpid()}\n".encode())


@app.task("work", max_retry=1000, retry_delay=0.1, timeout=TIMEOUT)
async def work(task: obsq.Task) -> None:
    record("S", task.payload)
    if BLOCK_EVERY and task.payload % BLOCK_EVERY == BLOCK_EVERY - 1 and not task.retry_count:
        time.sleep(BLOCK_SECONDS)  # blocks the event loop: the bug of a real app
    else:
        await asyncio.sleep(WORK_SECONDS)
    record("C", task.payload)
