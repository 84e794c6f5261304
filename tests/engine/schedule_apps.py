"""The App that subprocess schedulers of the engine tests run:

    python -m obsq scheduler tests.engine.schedule_apps:app --namespace NS --redis-url URL

It has no entries of its own (the tests add them at run time). Its producer hook, around
every enqueue of the scheduler, records on the Redis of tests/engine/apps.py:
  <prefix>:rec:attempts  the enqueue calls of all the schedulers, counted
  <prefix>:rec:created   the ids of the tasks they created (not those Redis refused as
                         duplicates)
and kills its own scheduler mid-fire, as SIGKILL or the OOM killer would, at the enqueue
call numbered $OBSQ_ENGINE_KILL_BEFORE (before the task reaches Redis) or
$OBSQ_ENGINE_KILL_AFTER (once Redis took it, before the scheduler confirms the fire).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import obsq
from tests.engine.apps import key, recorder

app = obsq.App(namespace="engine-schedules")


def _kill_at(name: str) -> int:
    return int(os.environ.get(name) or 0)


@app.use_producer
async def record(messages: list[obsq.TaskMessage], call_next: Any) -> list[obsq.TaskInfo]:
    attempt = await recorder().incr(key("attempts"))
    if attempt == _kill_at("OBSQ_ENGINE_KILL_BEFORE"):
        os.kill(os.getpid(), signal.SIGKILL)
    infos = await call_next(messages)
    created = [info.id for info in infos if not info.duplicate]
    if created:
        await recorder().rpush(key("created"), *created)
    if attempt == _kill_at("OBSQ_ENGINE_KILL_AFTER"):
        os.kill(os.getpid(), signal.SIGKILL)
    return infos
