"""Plain handlers for the worker subprocesses of the pool tests and the plain-task bench:

    python -m obsq worker tests.engine.pool_apps:app --pool process --namespace NS ...

They record on the Redis at $OBSQ_ENGINE_RECORD_URL, under $OBSQ_ENGINE_RECORD_PREFIX:
  <prefix>:rec:started    list of "<task id> <pid>", one per attempt that began
  <prefix>:rec:finished   list of task ids, one per attempt of `hang` that returned
  <prefix>:rec:quick      count of `quick` runs
`hang` blocks until the test pushes to <prefix>:rec:release (or payload["seconds"] pass), so
a test ends it as soon as it has seen what it waited for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import redis

import obsq

app = obsq.App(namespace="pool-apps")
_recorder: Any = None


def recorder() -> Any:
    global _recorder
    if _recorder is None or _recorder.pid != os.getpid():  # a child process: its own
        _recorder = redis.Redis.from_url(os.environ["OBSQ_ENGINE_RECORD_URL"])
        _recorder.pid = os.getpid()
    return _recorder


def key(name: str) -> str:
    return f"{os.environ['OBSQ_ENGINE_RECORD_PREFIX']}:rec:{name}"


@app.task("hang", timeout=1)
def hang(task: obsq.Task) -> None:
    """Overruns its timeout: blocks until released, at most payload["seconds"] (40)."""
    recorder().rpush(key("started"), f"{task.id} {os.getpid()}")
    recorder().blpop([key("release")], timeout=task.payload.get("seconds", 40))
    recorder().rpush(key("finished"), task.id)


@app.task("sleep")
def sleep(task: obsq.Task) -> None:
    """A truly hung call that nothing can release: time.sleep(payload seconds)."""
    recorder().rpush(key("started"), f"{task.id} {os.getpid()}")
    time.sleep(task.payload)


@app.task("quick", timeout=2)
def quick(task: obsq.Task) -> int:
    return recorder().incr(key("quick"))


@app.task("noop")
def noop(task: obsq.Task) -> None:
    """The bench's plain task: nothing at all."""


@app.task("crash")
def crash(task: obsq.Task) -> None:
    """Kills the process it runs in, as a native crash would."""
    recorder().rpush(key("started"), f"{task.id} {os.getpid()}")
    os._exit(3)


@app.task("nap")
def nap(task: obsq.Task) -> int:
    """Sleeps payload seconds and returns its pid, recording nothing (the direct tests of
    the process slots run it without a recording Redis)."""
    time.sleep(task.payload)
    return os.getpid()


@app.task("crash_quietly")
def crash_quietly(task: obsq.Task) -> None:
    """`crash` without its record."""
    os._exit(3)


@app.task("fail", max_retry=0)
def fail(task: obsq.Task) -> None:
    raise ValueError(f"bad input {task.payload!r}")


@app.task("describe")
def describe(task: obsq.Task) -> dict[str, Any]:
    """What the handler was given, and where it ran."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {"id": task.id, "type": task.type, "queue": task.queue, "payload": task.payload,
            "headers": task.headers, "retry_count": task.retry_count,
            "max_retry": task.max_retry, "timeout": task.timeout, "pid": os.getpid(),
            "cancelled": task.cancelled, "trace": carrier.get("traceparent")}


@app.task("relay")
def relay(task: obsq.Task) -> str:
    """Passes its payload on to `describe` through a SyncClient of the App, as a handler
    handing work on does; returns the new task's id."""
    with obsq.SyncClient(os.environ["OBSQ_ENGINE_RECORD_URL"], app=app,
                         namespace=os.environ["OBSQ_ENGINE_RECORD_PREFIX"]) as client:
        return client.enqueue("describe", task.payload, retention=60).id


@app.task("unsendable", max_retry=0)
def unsendable(task: obsq.Task) -> Any:
    """Returns what cannot leave its process (nor be JSON)."""
    return lambda: None


@app.task("not_json", max_retry=0)
def not_json(task: obsq.Task) -> Any:
    """Returns what pickles back but is not JSON: a datetime, or NaN (payload["nan"])."""
    import datetime

    return {"ratio": float("nan")} if task.payload.get("nan") else datetime.datetime.now()


@app.task("progress", max_retry=0)
def progress(task: obsq.Task) -> None:
    """Calls update_state, which a process pool's child cannot do."""
    task.update_state({"step": 1})


@dataclass
class Point:
    x: float
    y: float


@app.task("typed:norm", max_retry=0)
def norm(task: obsq.Task[Point]) -> float:
    """A typed plain handler: the child reads the payload back as a Point itself."""
    assert isinstance(task.payload, Point), task.payload
    return float((task.payload.x ** 2 + task.payload.y ** 2) ** 0.5)


@app.task("where", timeout=30)
def where(task: obsq.Task) -> int:
    """Records that it began, and returns the pid of the process it ran in."""
    recorder().rpush(key("started"), f"{task.id} {os.getpid()}")
    return os.getpid()


_kept: list[bytearray] = []


@app.task("leak", timeout=30)
def leak(task: obsq.Task) -> int:
    """`where`, keeping 60 MB for good, as a leaking handler does."""
    _kept.append(bytearray(b"x" * (60 << 20)))
    return where(task)
