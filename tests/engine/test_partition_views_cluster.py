"""A partitioned queue seen by an operator on a three-master Redis Cluster, where its
partitions live on different masters: the Inspector, `obsq queues` and the queue gauges
show one queue, and its reads and repairs reach every partition without a cross-slot call."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.cluster import RedisCluster

import obsq
from obsq.inspection.inspector import Inspector
from obsq.names import partition_names

PARTS = partition_names("events", 3)


@pytest.fixture
def redis_url(redis_cluster: str) -> str:
    """Every fixture these tests use (namespace, app, client, broker, raw_redis) runs on
    the cluster."""
    return redis_cluster


async def test_one_queue_over_three_masters(app, client, broker, raw_redis: RedisCluster,
                                            redis_url, namespace, obsq_cli) -> None:
    from obsq.observability.collector import QueueCollector

    assert len({raw_redis.get_node_from_key(f"{namespace}:{{{p}}}:pending").name
                for p in PARTS}) == 3
    app.queue("events", partitions=3)
    ids = [(await client.enqueue("ev:a", i, queue="events")).id for i in range(30)]
    async with Inspector(redis_url, namespace) as inspector:
        [info] = await inspector.queues()
        assert info.name == "events" and info.depth["pending"] == 30
        assert [p.name for p in info.partitions] == list(PARTS)
        assert all(p.depth["pending"] for p in info.partitions)
        seen, offset = [], 0
        while offset is not None:
            page = await inspector.tasks("events", "pending", 7, offset)
            seen += [t.id for t in page.tasks]
            offset = page.next_offset
        assert sorted(seen) == sorted(ids)
        for task_id in ids[:5]:
            assert (await inspector.task(task_id, "events")).partition in PARTS
        await inspector.pause("events")
        assert (await inspector.queue("events")).paused

        code, out = await obsq_cli("queues", "events", "--json")
        assert code == 0 and json.loads(out)[0]["depth"]["pending"] == 30
        collector = QueueCollector(broker, asyncio.get_running_loop(), ["events"],
                                   cache_seconds=0)
        families = {f.name: f for f in await asyncio.to_thread(collector.collect)}
        assert {s.labels["state"]: s.value for s in families["obsq_queue_depth"].samples
                if s.labels["queue"] == "events"}["pending"] == 30

        assert await inspector.purge("events", "pending") == 30
        assert (await inspector.queue("events")).size == 0
    with pytest.raises(obsq.TaskNotFound):
        await client.info(ids[0], "events")
