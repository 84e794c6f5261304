"""The Apps that subprocess workers of the group and event tests run:

    python -m obsq worker tests.engine.fanout_apps:app --namespace NS --redis-url URL ...
    python -m obsq worker tests.engine.fanout_apps:late --queues late ...

Handlers record on the same Redis (tests/engine/apps.py's recorder), under
<prefix>:rec:...:
  batches     one JSON {"id", "group", "ids"} per run of an aggregated task
  aggregated  the first task id of the batch, per run of the aggregator (a batch claimed
              again runs it again)
  delivered   one "<subscriber> <event n>" per copy of an event handled successfully
  attempts:<id>  attempts of each copy for the subscriber that fails twice
$OBSQ_ENGINE_AGGREGATE_SLEEP makes the aggregator take that long (a worker to kill
mid-aggregation).
"""

from __future__ import annotations

import asyncio
import os

import orjson

import obsq
from tests.engine.apps import begin, key, recorder

app = obsq.App(namespace="fanout-apps")


@app.task("ingest:batch")
async def ingest_batch(task: obsq.Task) -> None:
    await recorder().rpush(key("batches"), orjson.dumps(
        {"id": task.id, "group": task.headers.get("obsq-group"), "ids": task.payload["ids"]}))


async def collect(group: str, tasks: list[obsq.Task]) -> tuple[str, dict[str, object]]:
    await recorder().rpush(key("aggregated"), tasks[0].id)
    await asyncio.sleep(float(os.environ.get("OBSQ_ENGINE_AGGREGATE_SLEEP", "0")))
    return "ingest:batch", {"ids": [t.id for t in tasks]}


app.aggregate("ingest:row", collect, max_size=10, max_delay=5, grace_period=0.3)


async def deliver(subscriber: str, task: obsq.Task) -> None:
    await recorder().rpush(key("delivered"), f"{subscriber} {task.payload['n']}")


@app.subscribe("order.created", name="billing")
async def billing(task: obsq.Task) -> None:
    await deliver("billing", task)


@app.subscribe("order.created", name="email", queue="mail")
async def email(task: obsq.Task) -> None:
    await deliver("email", task)


@app.subscribe("order.created", name="audit", retry_delay=0.05)
async def audit(task: obsq.Task) -> None:
    """Fails twice per event, then succeeds (its attempts counted as apps.begin does)."""
    if await begin(task) < 3:
        raise RuntimeError(f"attempt {task.retry_count + 1} fails")
    await deliver("audit", task)


late = obsq.App(namespace="fanout-apps")


@late.subscribe("order.created", name="late", queue="late")
async def late_subscriber(task: obsq.Task) -> None:
    await deliver("late", task)
