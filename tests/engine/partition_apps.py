"""The App that subprocess workers of the partition tests run (tests/engine/
test_partition_cluster.py): one queue, `hot`, of three partitions. Each attempt records
"<task id> <pid>" when it starts and when it returns, and the keyed tasks record
"<key> <n>" in the order they ran, under the prefix and at the URL of tests/engine/apps.py
(a plain Redis beside the Cluster the tasks are in)."""

from __future__ import annotations

import asyncio
import os

import obsq

from .apps import key, recorder

app = obsq.App(namespace="engine-partition-apps")
app.queue("hot", partitions=3)


@app.task("part:work", queue="hot", max_retry=3, retry_delay=0)
async def work(task: obsq.Task) -> str:
    """Sleeps payload["sleep"] seconds; returns the partition that held it."""
    await recorder().rpush(key("part-started"), f"{task.id} {os.getpid()}")
    await asyncio.sleep(task.payload["sleep"])
    await recorder().rpush(key("part-finished"), f"{task.id} {os.getpid()}")
    return task.partition


@app.task("part:keyed", queue="hot", max_retry=3, retry_delay=0)
async def keyed(task: obsq.Task) -> None:
    """Records its ordering key and its number in the order the keyed tasks ran."""
    await asyncio.sleep(0.01)
    await recorder().rpush(key("part-keyed"), f"{task.ordering_key} {task.payload}")
