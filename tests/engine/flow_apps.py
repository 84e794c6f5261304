"""The App that subprocess workers of the flow tests run (tests/engine/test_flow_crashes.py):
each attempt records "<task id> <pid>" when it starts and when it returns, under the
prefix and at the URL of tests/engine/apps.py (`flow-started`, `flow-finished`)."""

from __future__ import annotations

import asyncio
import os

import obsq

from .apps import key, recorder

app = obsq.App(namespace="engine-flow-apps")


async def _record(name: str, task: obsq.Task) -> None:
    await recorder().rpush(key(name), f"{task.id} {os.getpid()}")


@app.task("flow:add", max_retry=3, retry_delay=0)
async def add(task: obsq.Task) -> int:
    """Sleeps payload["sleep"] seconds, returns payload["n"] plus the previous result(s)."""
    await _record("flow-started", task)
    await asyncio.sleep(task.payload["sleep"])
    previous = task.previous
    total = sum(previous) if isinstance(previous, list) else (previous or 0)
    await _record("flow-finished", task)
    return total + task.payload["n"]


@app.task("flow:plain", max_retry=0)
def plain(task: obsq.Task) -> list:
    """A plain handler (a thread, or a child process with --pool process): what it read."""
    previous = task.previous
    return [p.error if isinstance(p, obsq.StepFailure) else p for p in previous] \
        if isinstance(previous, list) else [previous, os.getpid()]
