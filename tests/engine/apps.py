"""The App that subprocess workers of the engine tests run:

    python -m obsq worker tests.engine.apps:app --namespace NS --redis-url URL ...

The namespace below is replaced by `--namespace`. Handlers record what they do on the
same Redis, under the prefix in $OBSQ_ENGINE_RECORD_PREFIX (the test's namespace, so the
namespace fixture cleans it up), at the URL in $OBSQ_ENGINE_RECORD_URL:
  <prefix>:rec:started   list of task ids, one entry per attempt that began
  <prefix>:rec:finished  list of task ids, one entry per attempt that returned
  <prefix>:rec:attempts:<id>  attempt counter of one task
  <prefix>:rec:span      list of "<start µs> <end µs> <id> <payload>", one per attempt that
                         returned (routes with limits and ordering keys)
  <prefix>:rec:admitted  list of the times (ms, Redis's clock) a rate-limited attempt was
                         let start: its lease's expiry less the lease (30 s by default)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import orjson
import redis.asyncio as aioredis

import obsq

app = obsq.App(namespace="engine-apps")
_recorder: Any = None


def recorder() -> Any:
    global _recorder
    if _recorder is None:
        _recorder = aioredis.Redis.from_url(os.environ["OBSQ_ENGINE_RECORD_URL"])
    return _recorder


def key(name: str) -> str:
    return f"{os.environ['OBSQ_ENGINE_RECORD_PREFIX']}:rec:{name}"


async def begin(task: obsq.Task) -> int:
    """Record the start of an attempt; returns its number (1 for the first)."""
    pipe = recorder().pipeline(transaction=False)
    pipe.incr(key(f"attempts:{task.id}"))
    pipe.rpush(key("started"), task.id)
    attempt, _ = await pipe.execute()
    return int(attempt)


@app.task("sleep")
async def sleep(task: obsq.Task) -> dict[str, int]:
    """Sleeps payload["first"] seconds on its first attempt, payload["then"] afterwards."""
    attempt = await begin(task)
    await asyncio.sleep(task.payload["first"] if attempt == 1 else task.payload.get("then", 0))
    await recorder().rpush(key("finished"), task.id)
    return {"attempt": attempt}


@app.task("poison")
async def poison(task: obsq.Task) -> None:
    """Kills its own worker, as a segfaulting extension or an OOM kill would."""
    await begin(task)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task("crash")
async def crash(task: obsq.Task) -> None:
    """Ends its own worker process at once, with no cleanup, as a native crash would."""
    await begin(task)
    os._exit(1)


async def span(task: obsq.Task, seconds: float) -> None:
    """Record the attempt's start and end (this host's clock, in µs) under <prefix>:rec:span,
    as "<start> <end> <id> <payload>", around `seconds` of work."""
    start = time.time()
    await asyncio.sleep(seconds)
    await recorder().rpush(key("span"), f"{start * 1e6:.0f} {time.time() * 1e6:.0f} {task.id} "
                                        f"{orjson.dumps(task.payload).decode()}")


@app.task("limited", concurrency=3)
async def limited(task: obsq.Task) -> None:
    """At most three at once across all workers; each takes payload["seconds"]."""
    await span(task, task.payload["seconds"])


@app.task("keyed", key_concurrency=1, fairness_key=lambda payload: payload["key"])
async def keyed(task: obsq.Task) -> None:
    """At most one at once per fairness key (payload["key"]) across all workers."""
    await span(task, task.payload["seconds"])


@app.task("paced", rate_limit="200/s")
async def paced(task: obsq.Task) -> None:
    """At most 200 starts a second across all workers."""
    lease = f"{os.environ['OBSQ_ENGINE_RECORD_PREFIX']}:{{{task.queue}}}:lease"
    expiry = await recorder().zscore(lease, task.id)
    await recorder().rpush(key("admitted"), expiry - 30_000)
    await span(task, 0)


@app.task("ordered")
async def ordered(task: obsq.Task) -> None:
    """Fails once when payload["fail_once"] is set: its retry must keep its key's order."""
    await span(task, task.payload.get("seconds", 0.01))
    if task.payload.get("fail_once") and task.retry_count == 0:
        raise RuntimeError("first attempt fails")


@app.task("blob")
def blob(task: obsq.Task) -> dict[str, Any]:
    """A plain function given a bytes payload: returns what it got, as hex (results are
    JSON), and the process that ran it."""
    return {"kind": type(task.payload).__name__, "hex": task.payload.hex(), "pid": os.getpid()}


@app.task("block")
async def block(task: obsq.Task) -> None:
    """Blocks the event loop for payload["seconds"] (a sync call in an async def, the bug
    of a real app), on its first attempt only."""
    if await begin(task) == 1:
        time.sleep(task.payload["seconds"])
    await recorder().rpush(key("finished"), task.id)


@app.task("debounced")
async def debounced(task: obsq.Task) -> None:
    """Enqueued with a debounce_key (tests/engine/test_debounce.py); records its payload."""
    await span(task, 0)
