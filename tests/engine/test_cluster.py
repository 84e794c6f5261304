"""obsq on a three-node Redis Cluster (redis+cluster://): every queue is one hash slot, and
the queues below live on different nodes, so every script must stay inside one slot and
every multi-key call must be split by slot. The schedules share a slot of their own."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot
from support import wait_until

import obsq
from obsq import cli

QUEUES = ("alpha", "beta", "delta")  # slots 865, 15419 and 9053: one on each master


@pytest.fixture
def redis_url(redis_cluster: str) -> str:
    """Every fixture these tests use (namespace, app, client, broker, raw_redis,
    start_worker) runs on the cluster."""
    return redis_cluster


def test_the_test_queues_live_on_different_nodes(raw_redis: RedisCluster) -> None:
    nodes = {raw_redis.get_node_from_key(f"ns:{{{q}}}:pending").name for q in QUEUES}
    assert len(nodes) == 3
    assert len({key_slot(f"ns:{{{q}}}:pending".encode()) for q in QUEUES}) == 3


async def test_enqueue_work_result_retry_and_delay_on_a_cluster(
        redis_url, namespace, app, client, raw_redis,
        start_worker) -> None:

    @app.task("echo")
    async def echo(task: obsq.Task):
        await task.update_state({"queue": task.queue})
        return {"queue": task.queue, "payload": task.payload}

    @app.task("flaky", retry_delay=0.1)
    async def flaky(task: obsq.Task):
        if task.retry_count == 0:
            raise RuntimeError("first attempt fails")
        return task.retry_count

    @app.task("hopeless")
    async def hopeless(task: obsq.Task):
        raise obsq.SkipRetry("never")

    worker = await start_worker(queues={q: 1 for q in QUEUES})
    for queue in QUEUES:
        info = await client.enqueue("echo", queue, queue=queue, retention=60)
        assert await client.result(info, timeout=15) == {"queue": queue, "payload": queue}
        stored = await client.info(info.id)  # found by id alone, across the slots
        assert (stored.state, stored.queue, stored.progress) == ("completed", queue,
                                                                 {"queue": queue})
    retried = await client.enqueue("flaky", queue="beta", retention=60)
    assert await client.result(retried, timeout=15) == 1
    assert (await client.info(retried.id)).retry_count == 1

    delayed = await client.enqueue("echo", "later", queue="alpha", delay=0.3, retention=60)
    assert (await client.info(delayed.id)).state == "scheduled"
    assert (await client.result(delayed, timeout=15))["payload"] == "later"

    dead = await client.enqueue("hopeless", queue="delta", retention=60)
    with pytest.raises(obsq.TaskFailed, match="never"):
        await client.result(dead, timeout=15)

    many = await client.enqueue_many(
        [obsq.Job("echo", i, queue=QUEUES[i % 3], retention=60) for i in range(30)]
        + [obsq.Job("echo", "u", queue="alpha", unique_for=60),
           obsq.Job("echo", "u", queue="alpha", unique_for=60)])
    assert [m.duplicate for m in many[-2:]] == [False, True]
    results = await asyncio.gather(*(client.result(m, timeout=15) for m in many[:30]))
    assert [r["payload"] for r in results] == list(range(30))

    # every key obsq wrote carries its queue's hash tag (or is one of the global keys)
    for key in raw_redis.scan_iter(match=f"{namespace}:*", count=1000):
        name = key.decode()
        assert any(f":{{{q}}}:" in name for q in QUEUES) or name.split(":")[1] in (
            "queues", "workers", "worker", "lock", "dataset"), name
    assert worker.health().redis_ok
    stats = await client.broker.queue_stats(list(QUEUES))
    assert stats["delta"].depth["dead"] == 1


async def test_workers_and_stats_on_a_cluster(redis_url, namespace, app,
                                              broker, start_worker, capsys) -> None:
    workers = [await start_worker(queues=",".join(QUEUES)) for _ in range(3)]
    described = await broker.workers()
    assert sorted(w["id"] for w in described) == sorted(w.id for w in workers)
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, ["stats", "--redis-url", redis_url,
                                              "--namespace", namespace])
    table = capsys.readouterr().out
    assert code == 0 and "3 live worker(s)" in table
    for queue in QUEUES:
        assert queue in table


async def test_a_lost_workers_tasks_are_recovered_on_a_cluster(
        redis_url, namespace, app, client, broker, raw_redis,
        start_worker) -> None:
    @app.task("echo")
    async def echo(task: obsq.Task):
        return task.payload

    infos = []
    for i, queue in enumerate(QUEUES):
        infos.append(await client.enqueue("echo", queue, queue=queue, retention=60))
        # taken by workers that then vanished without a trace (their heartbeat keys,
        # in other slots, are gone), with leases far from expiry
        await broker.dequeue(queue, 1, f"ghost-{i}", lease_seconds=600)
    old = int((time.time() - 60) * 1000)
    raw_redis.zadd(f"{namespace}:workers", {f"ghost-{i}": old for i in range(3)})
    for info in infos:
        assert (await client.info(info.id)).state == "active"

    await start_worker(queues=",".join(QUEUES))
    for info in infos:
        assert await client.result(info, timeout=20) == info.queue
    await wait_until(lambda: not raw_redis.zrangebyscore(f"{namespace}:workers", 0, old))


async def test_schedules_fire_on_a_cluster(app, client, raw_redis, namespace, start_worker,
                                           start_scheduler) -> None:
    ran: list[str] = []

    @app.task("tick")
    async def tick(task: obsq.Task):
        ran.append(task.id)

    app.periodic("@every 0.3s", "tick", name="alpha-tick", queue="alpha")
    await client.schedule("beta-tick", "@every 0.3s", "tick", queue="beta")
    await start_worker(queues=",".join(QUEUES))
    scheduler = await start_scheduler()
    for entry in ("alpha-tick", "beta-tick"):
        await wait_until(lambda e=entry: sum(i.startswith(e + "@") for i in ran) >= 3,
                         timeout=15)
    assert await client.unschedule("beta-tick") is True
    listed = {s.name: s for s in await client.schedules()}
    assert list(listed) == ["alpha-tick"] and listed["alpha-tick"].fire_count >= 3
    assert len(ran) == len(set(ran)) and not scheduler.loop.failures
    keys = raw_redis.scan_iter(match=f"{namespace}:{{schedules}}:*")
    assert len({key_slot(key) for key in keys}) == 1


async def test_groups_and_events_on_a_cluster(app, client, start_worker) -> None:
    """Each group's keys live in its queue's slot, the subscriptions in a slot of their own;
    the aggregated tasks and the event copies go to queues on other nodes."""
    done: list[tuple[str, object]] = []

    @app.task("rows:sum", queue="delta")
    async def total(task: obsq.Task) -> None:
        done.append((task.queue, task.payload))

    app.aggregate("rows:add", lambda group, tasks: ("rows:sum", sum(t.payload for t in tasks)),
                  max_size=3, grace_period=0.2)

    @app.subscribe("paid", name="ledger", queue="beta")
    async def ledger(task: obsq.Task) -> None:
        done.append((task.queue, task.type))

    await start_worker(queues={q: 1 for q in QUEUES})
    for n in range(4):
        await client.enqueue("rows:add", n, queue="alpha", group="g")
    assert [i.queue for i in await client.publish("paid", {})] == ["beta"]
    await wait_until(lambda: len(done) == 3)
    assert sorted(done, key=str) == [("beta", "paid@ledger"), ("delta", 3), ("delta", 3)]


async def test_a_user_restricted_to_the_cluster_rule_works_on_every_node(
        redis_url, namespace, app, raw_redis, start_worker) -> None:
    """`obsq acl --cluster`: the namespace's rule and what a Cluster client asks each node
    on connecting; no node's ACL LOG records a denied command but two left out on purpose:
    CONFIG GET (the eviction check reads INFO then) and redis-py's optional handshake on a
    new connection (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), which it goes without."""
    from obsq.broker.acl import acl_rule

    user = f"acl-{namespace}"
    nodes = raw_redis.get_primaries()
    for node in nodes:
        raw_redis.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw",
                                  *acl_rule(namespace, cluster=True).split(), target_nodes=node)
        raw_redis.execute_command("ACL", "LOG", "RESET", target_nodes=node)
    url = redis_url.replace("://", f"://{user}:pw@", 1)

    @app.task("echo")
    async def echo(task: obsq.Task):
        return task.payload

    await start_worker(redis_url=url, queues=",".join(QUEUES))  # the user outlives it
    async with obsq.Client(url, app=app) as client:
        infos = [await client.enqueue("echo", q, queue=q, retention=60) for q in QUEUES]
        assert [await client.result(i, timeout=15) for i in infos] == list(QUEUES)
    denied = [entry for node in nodes
              for entry in raw_redis.execute_command("ACL", "LOG", target_nodes=node)
              if entry[b"object"] not in (b"config", b"config|get", b"client")]
    assert denied == []


async def test_credentials_from_the_environment_reach_every_node(
        redis_url, namespace, app, raw_redis, start_worker, monkeypatch) -> None:
    """OBSQ_REDIS_USERNAME and OBSQ_REDIS_PASSWORD beside a redis+cluster:// URL without
    credentials: the client logs in on each node it is sent to."""
    from obsq.broker.acl import acl_rule

    user = f"env-{namespace}"
    for node in raw_redis.get_primaries():
        raw_redis.execute_command("ACL", "SETUSER", user, "reset", "on", ">env-pw",
                                  *acl_rule(namespace, cluster=True).split(), target_nodes=node)
    monkeypatch.setenv("OBSQ_REDIS_USERNAME", user)
    monkeypatch.setenv("OBSQ_REDIS_PASSWORD", "env-pw")

    @app.task("echo")
    async def echo(task: obsq.Task):
        return task.payload

    await start_worker(queues=",".join(QUEUES))
    async with obsq.Client(redis_url, app=app) as client:
        infos = [await client.enqueue("echo", q, queue=q, retention=60) for q in QUEUES]
        assert [await client.result(i, timeout=15) for i in infos] == list(QUEUES)
        clients = [c for node in raw_redis.get_primaries()
                   for c in raw_redis.client_list(target_nodes=node)]
        assert user in {c["user"] for c in clients}


async def test_doctor_reads_and_mends_every_queue_on_its_node(namespace, client, raw_redis,
                                                              obsq_cli) -> None:
    for queue in QUEUES:
        await client.enqueue("echo", queue=queue, ordering_key="k:1")
        await client.enqueue("echo", queue=queue, ordering_key="k:1")
    raw_redis.lpush(f"{namespace}:{{beta}}:pending", "ghost")
    code, out = await obsq_cli("doctor")
    problems = [line for line in out.splitlines() if not line.startswith("notice:")]
    assert code == 1 and problems == ["beta: ids with no task in pending: 1 (e.g. ghost)"], out
    assert "no live worker serves" in out  # no worker runs here: a notice, not a problem
    code, out = await obsq_cli("doctor", "--repair")
    assert code == 0 and "repaired beta: dropped 1 id(s) with no task" in out, out


async def test_a_cluster_url_names_several_seeds_and_starts_while_one_is_down(
        redis_url, namespace, app, start_worker) -> None:
    """A worker restarted while the master its URL names was down could not start though
    the other nodes were up: a URL names several seeds, tried in turn."""
    with socket.socket() as unused:  # a port nothing listens on: the first seed is down
        unused.bind(("127.0.0.1", 0))
        down = unused.getsockname()[1]
    seeds = redis_url.replace("//", f"//127.0.0.1:{down},", 1)
    ran: list[int] = []

    @app.task("echo")
    async def echo(task: obsq.Task) -> None:
        ran.append(task.payload)

    await start_worker(redis_url=seeds, queues=dict.fromkeys(QUEUES, 1))
    client = obsq.Client(seeds, namespace, app=app)
    sync_client = obsq.SyncClient(seeds, namespace, app=app)
    try:
        for n, queue in enumerate(QUEUES):
            await client.enqueue("echo", n, queue=queue)
        sync_client.enqueue("echo", 3, queue=QUEUES[0])
        await wait_until(lambda: sorted(ran) == [0, 1, 2, 3], what="every task run")
    finally:
        await client.close()
        sync_client.close()
    for url in (redis_url.replace("//", "//127.0.0.1:x,", 1), f"{redis_url},127.0.0.1:y"):
        with pytest.raises(obsq.ConfigurationError, match="invalid: Port could not be cast"):
            obsq.Client(url, namespace)
