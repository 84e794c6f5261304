"""A partitioned queue on a three-master Redis Cluster: its partitions live on every master,
which serve its script calls evenly; worker processes, one SIGKILLed halfway, run every task
and keep each ordering key's order; `obsq doctor` finds nothing wrong afterwards."""

from __future__ import annotations

import collections
import signal

import pytest
import redis
from redis.cluster import RedisCluster
from support import ObsqProcess, wait_until

import obsq
from obsq.names import partition_names

from .helpers import record_key

PARTITION_APP = "tests.engine.partition_apps:app"


@pytest.fixture
def redis_url(redis_cluster: str) -> str:
    return redis_cluster


def _records(recorded, namespace: str, name: str) -> list[list[str]]:
    return [v.decode().split() for v in recorded.lrange(record_key(namespace, name), 0, -1)]


def _nodes(raw_redis: RedisCluster, names) -> list[str]:
    return [raw_redis.get_node_from_key(f"ns:{{{name}}}:pending").name for name in names]


def test_partitions_spread_over_the_masters(raw_redis: RedisCluster) -> None:
    assert len(set(_nodes(raw_redis, partition_names("hot", 3)))) == 3
    six = collections.Counter(_nodes(raw_redis, partition_names("hot", 6)))
    assert sorted(six.values()) == [2, 2, 2]
    for queue in ("events", "a-much-longer-queue-name", "q"):
        assert len(set(_nodes(raw_redis, partition_names(queue, 3)))) == 3


def _script_calls(raw_redis: RedisCluster) -> dict[str, int]:
    stats = raw_redis.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
    return {node: info.get("cmdstat_evalsha", {}).get("calls", 0)
            for node, info in stats.items()}


async def test_each_master_serves_an_even_share_of_the_queue(app, client, broker, raw_redis,
                                                             start_worker) -> None:
    app.queue("hot", partitions=3)

    @app.task("noop", queue="hot")
    async def noop(task: obsq.Task) -> None:
        return None

    await start_worker(queues={"hot": 1}, concurrency=50)
    before = _script_calls(raw_redis)
    infos = await client.enqueue_many([obsq.Job("noop", i) for i in range(3000)])

    async def drained() -> bool:
        stats = await broker.queue_stats(partition_names("hot", 3))
        return not any(s.depth["pending"] + s.depth["active"] for s in stats.values())
    await wait_until(drained, timeout=60, what="the queue drained")
    after = _script_calls(raw_redis)
    calls = {node: after[node] - before.get(node, 0) for node in after}
    print("script calls per master:", calls)
    assert set(i.partition for i in infos) == set(partition_names("hot", 3))
    assert all(0.25 <= n / sum(calls.values()) <= 0.42 for n in calls.values()), calls


async def test_worker_processes_survive_a_sigkill_halfway(client, raw_redis, namespace,
                                                         spawn_worker, obsq_cli,
                                                         private_redis) -> None:
    client.app = None  # a producer without the App learns the count the workers wrote
    recorded = redis.Redis.from_url(private_redis.url)  # what the handlers record

    def spawn() -> ObsqProcess:
        return spawn_worker(app=PARTITION_APP, concurrency=8,
                            OBSQ_ENGINE_RECORD_URL=private_redis.url)

    workers = [spawn() for _ in range(3)]
    await wait_until(lambda: raw_redis.hget(f"{namespace}:partitions", "hot") == b"3",
                     timeout=30, what="the workers' partition count")
    keyed = [obsq.Job("part:keyed", n, queue="hot", ordering_key=f"k{k}")
             for n in range(10) for k in range(6)]
    infos = await client.enqueue_many(
        [obsq.Job("part:work", {"sleep": 0.02}, queue="hot") for _ in range(600)] + keyed)
    assert len({i.partition for i in infos}) == 3
    await wait_until(lambda: len(_records(recorded, namespace, "part-finished")) >= 300,
                     timeout=60, what="half the tasks done")
    workers[0].signal(signal.SIGKILL)
    spawn()
    await wait_until(lambda: {r[0] for r in _records(recorded, namespace, "part-finished")}
                     >= {i.id for i in infos[:600]}, timeout=90, what="every task done")
    await wait_until(lambda: len(_records(recorded, namespace, "part-keyed")) >= 60,
                     timeout=60, what="every keyed task done")
    order = collections.defaultdict(list)
    for key, n in _records(recorded, namespace, "part-keyed"):
        order[key].append(int(n))
    for key, ran in order.items():  # in order; a task run again only right after itself
        assert sorted(set(ran)) == list(range(10)) and ran == sorted(ran), (key, ran)
    started = collections.defaultdict(list)
    for task_id, pid in _records(recorded, namespace, "part-started"):
        started[task_id].append(pid)
    again = {task_id: pids for task_id, pids in started.items()
             if pids[:-1] != [str(workers[0].pid)] * (len(pids) - 1)}
    assert not again, (workers[0].pid, again)  # again only what the killed worker held
    code, output = await obsq_cli("doctor")
    assert code == 0, output
