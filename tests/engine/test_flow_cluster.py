"""Flows on a three-node Redis Cluster: a flow's keys share its own hash tag, its steps run
in queues on the other nodes, and a step's end crosses from its queue's slot to its flow's
through the queue's flow inbox (recorded, then the next step enqueued in its own slot)."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

import obsq
from obsq import Job, chain, chord
from obsq.broker import FlowKeys

from .test_cluster import QUEUES


@pytest.fixture
def redis_url(redis_cluster: str) -> str:
    return redis_cluster


async def test_a_flow_across_the_nodes_of_a_cluster(app, client, raw_redis, namespace,
                                                    start_worker, obsq_cli) -> None:
    @app.task("add", max_retry=0)
    async def add(task: obsq.Task):
        previous = task.previous
        return (sum(previous) if isinstance(previous, list) else previous or 0) + task.payload

    @app.task("boom", max_retry=0)
    async def boom(task: obsq.Task):
        raise RuntimeError("boom")

    await start_worker(queues={q: 1 for q in QUEUES})
    flow = await client.enqueue(chain(
        Job("add", 1, queue="alpha"),
        chord([Job("add", n, queue=QUEUES[n % 3]) for n in range(9)], Job("add", 0,
                                                                           queue="beta")),
        Job("add", 100, queue="delta")))
    assert await client.result(flow, timeout=30) == 9 + sum(range(9)) + 100
    keys = FlowKeys(namespace, flow.id)
    assert len({key_slot(k.encode()) for k in (keys.flow, keys.results, keys.launching)}) == 1
    nodes = {raw_redis.get_node_from_key(f"{namespace}:{{{q}}}:pending").name for q in QUEUES}
    assert len(nodes) == 3  # the steps ran on every node, the flow's keys live on one

    failed = await client.enqueue(chain(Job("add", 1, queue="alpha"),
                                        Job("boom", queue="delta"), Job("add", 1)))
    with pytest.raises(obsq.FlowFailed, match="boom"):
        await client.result(failed, timeout=30)
    assert await client.delete(failed) == "failed"
    code, output = await obsq_cli("doctor")
    assert code == 0, output
