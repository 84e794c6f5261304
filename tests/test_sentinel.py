"""obsq through Redis Sentinel: the URL names the sentinels and the service, and the
client follows a failover to the new master."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import missing_tool, one_clear_line, run_obsq, wait_for, wait_until

import obsq
from obsq.redis_server import RedisServer, free_port


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[str, RedisServer, RedisServer]]:
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    master = RedisServer().start()
    replica = RedisServer().start()
    redis.Redis(port=replica.port).replicaof("127.0.0.1", master.port)
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\n"
                      f"sentinel monitor obsqmaster 127.0.0.1 {master.port} 1\n"
                      "sentinel down-after-milliseconds obsqmaster 1000\n"
                      "sentinel failover-timeout obsqmaster 5000\n")
    process = subprocess.Popen(["redis-server", str(config), "--sentinel"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: redis.Redis(port=port).sentinel_master("obsqmaster")["num-slaves"] >= 1,
             timeout=30, what="the sentinel seeing the replica")  # its INFO every 10 s
    yield f"redis+sentinel://127.0.0.1:{port}/obsqmaster/0", master, replica
    process.kill()
    process.wait()
    master.close()
    replica.close()


async def test_a_worker_and_a_client_run_through_sentinel_and_follow_a_failover(
        sentinel, start_worker, namespace):
    url, master, replica = sentinel
    app = obsq.App(namespace=namespace)

    @app.task("echo", retry_delay=0)
    async def echo(task: obsq.Task):
        return task.payload

    client = obsq.Client(url, namespace=namespace)
    sync = obsq.SyncClient(url, namespace=namespace)  # enqueues on its own blocking client
    await start_worker(app, redis_url=url)
    first = await client.enqueue("echo", {"n": 1}, retention=60)
    assert await client.result(first, timeout=10) == {"n": 1}
    sent = await asyncio.to_thread(sync.enqueue, "echo", {"n": 3}, retention=60)
    assert await client.result(sent, timeout=10) == {"n": 3}

    master.stop()  # the sentinel promotes the replica within a few seconds

    async def served_again() -> bool:
        try:
            info = await client.enqueue("echo", {"n": 2}, retention=60)
            return await client.result(info, timeout=3) == {"n": 2}
        except (obsq.BrokerError, TimeoutError):
            return False

    await wait_until(served_again, timeout=30, interval=0.5)
    assert redis.Redis(port=replica.port).info("replication")["role"] == "master"

    async def sync_served_again() -> bool:
        try:
            info = await asyncio.to_thread(sync.enqueue, "echo", {"n": 4}, retention=60)
            return await client.result(info, timeout=3) == {"n": 4}
        except (obsq.BrokerError, TimeoutError):
            return False

    await wait_until(sync_served_again, timeout=30, interval=0.5)
    await asyncio.to_thread(sync.close)
    await client.close()


async def test_durable_replicas_waits_for_the_replica_and_refuses_without_it(sentinel,
                                                                           namespace):
    _, master, replica = sentinel
    client = obsq.Client(master.url, namespace=namespace, durable_replicas=1)
    wait_for(lambda: redis.Redis(port=replica.port).info("replication")["master_link_status"]
             == "up", timeout=30, what="the replica in sync")
    try:
        info = await client.enqueue("echo", {"n": 1})
        assert redis.Redis(port=replica.port).exists(f"{namespace}:{{default}}:t:{info.id}")
        replica.stop()
        client.broker.durable_timeout = 0.3
        with pytest.raises(obsq.BrokerError, match="reached 0 of the 1 replica"):
            await client.enqueue("echo", {"n": 2})
    finally:
        await client.close()


def test_sentinels_that_do_not_answer_are_one_readable_line() -> None:
    ports = free_port(), free_port()
    result = run_obsq("stats", "--redis-url",
                      f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/obsqmaster/0")
    line = one_clear_line(result, "cannot reach Redis", "No master found for 'obsqmaster'",
                          f"no answer from the Sentinels at 127.0.0.1:{ports[0]} "
                          f"(ConnectionError), 127.0.0.1:{ports[1]} (ConnectionError)")
    assert "<redis" not in line and len(line) < 300
