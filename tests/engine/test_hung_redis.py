"""Producers on a Redis that stops answering (SIGSTOP: the kernel still takes the bytes,
so no connection breaks). Every producer call ends with BrokerTimeout within its
deadline, and once Redis answers again (SIGCONT) the calls work, each reply read by the
call it answers: no task is written twice and no late reply is taken for another call's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from support import sync_redis, wait_until

import obsq
from obsq.broker import QueueKeys
from obsq.redis_server import RedisServer

GUARD = 60  # seconds: a call that has not ended by then blocks for good (the old behaviour)


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def pending_ids(server: RedisServer, namespace: str) -> list[str]:
    keys = QueueKeys(namespace, "default")
    return [i.decode() for i in sync_redis(server.url).lrange(keys.pending, 0, -1)]


async def test_the_client_ends_every_call_on_a_stopped_redis_and_recovers(
        app, namespace, private_redis, start_worker) -> None:
    @app.task("t")
    async def handler(task: obsq.Task):
        return task.payload

    failures: list[str] = []
    client = obsq.Client(private_redis.url, namespace, app=app, call_timeout=1)
    client.redis_error_hooks.append(lambda operation, exc: failures.append(operation))
    try:
        first = await client.enqueue("t", "first", task_id="first")
        with stopped(private_redis):
            calls = {
                "enqueue": client.enqueue("t", "lost?", task_id="while-stopped"),
                "enqueue_many": client.enqueue_many([obsq.Job("t", i) for i in range(3)]),
                "a flow": client.enqueue(obsq.chain(obsq.Job("t", 1), obsq.Job("t", 2))),
                "new queue": client.enqueue("t", "x", queue="elsewhere"),
                "info": client.info(first.id),
                "result": client.result(first.id, timeout=None),
                "cancel": client.cancel(first.id),
                "delete": client.delete(first.id),
                "publish": client.publish("order.created", {}),
                "schedule": client.schedule("nightly", "0 3 * * *", "t"),
                "schedules": client.schedules(),
            }
            for name, call in calls.items():
                with pytest.raises(obsq.BrokerTimeout) as caught:
                    await asyncio.wait_for(call, GUARD)
                assert "within the call deadline of 1 s" in str(caught.value), name
                assert private_redis.url.split("//")[1] in str(caught.value)
                writes = name not in ("info", "result", "schedules")  # the others write
                assert ("a write it carried may still happen" in str(caught.value)) is \
                    writes, (name, str(caught.value))
            # concurrent enqueues share round trips: those waiting behind a hung one end too
            together = await asyncio.wait_for(asyncio.gather(
                *(client.enqueue("t", i) for i in range(20)), return_exceptions=True), GUARD)
            assert all(isinstance(e, obsq.BrokerTimeout) for e in together), together
        assert "enqueue" in failures  # counted like any failed Redis call

        # Redis answers again: each call reads its own reply (none left over from the calls
        # that timed out), and the task sent before the deadline is there once at most
        await start_worker(redis_url=private_redis.url)
        after = await client.enqueue("t", "after", task_id="after", retention=60)
        assert after.id == "after" and not after.duplicate
        assert await client.result(after, timeout=30) == "after"
        assert (await client.info("after")).state == "completed"
        with suppress(obsq.DuplicateTask):  # Redis ran what it was sent before it stopped
            await client.enqueue("t", "lost?", task_id="while-stopped")
        await wait_until(lambda: not pending_ids(private_redis, namespace), timeout=30)
        assert (await client.enqueue_many([obsq.Job("t", 1, task_id="batch")]))[0].id == "batch"
    finally:
        await client.close()


def test_the_sync_client_ends_every_call_on_a_stopped_redis_and_recovers(
        namespace, private_redis) -> None:
    client = obsq.SyncClient(private_redis.url, namespace, call_timeout=1)
    pool = concurrent.futures.ThreadPoolExecutor(8)
    try:
        client.enqueue("t", "first", task_id="first")
        with stopped(private_redis):
            calls = {
                "enqueue": lambda: client.enqueue("t", "lost?", task_id="while-stopped"),
                "enqueue_many": lambda: client.enqueue_many([obsq.Job("t", 1)]),
                "new queue": lambda: client.enqueue("t", "x", queue="elsewhere"),
                "info": lambda: client.info("first"),
                "cancel": lambda: client.cancel("first"),
                "schedules": client.schedules,
            }
            for name, call in calls.items():
                with pytest.raises(obsq.BrokerTimeout) as caught:
                    pool.submit(call).result(GUARD)
                assert "within the call deadline of 1 s" in str(caught.value), name
                # a new queue's first call reads its partition count: nothing written yet
                assert ("a write it carried may still happen" in str(caught.value)) is (
                    name not in ("info", "schedules", "new queue")), (name, str(caught.value))
            # request threads at once, more of them than the kept connection serves
            threads = [pool.submit(client.enqueue, "t", i) for i in range(8)]
            for thread in threads:
                with pytest.raises(obsq.BrokerTimeout):
                    thread.result(GUARD)

        after = pool.submit(client.enqueue, "t", "after", task_id="after").result(GUARD)
        assert after.id == "after" and not after.duplicate
        assert [client.enqueue("t", i, task_id=f"next-{i}").id for i in range(3)] == [
            "next-0", "next-1", "next-2"]
        assert client.info("after").state == "pending"
        with suppress(obsq.DuplicateTask):
            client.enqueue("t", "lost?", task_id="while-stopped")
        ids = pending_ids(private_redis, namespace)
        assert len(ids) == len(set(ids)), ids
        assert ids.count("while-stopped") == 1
    finally:
        pool.shutdown(wait=False)
        client.close()


def test_a_new_queue_whose_count_is_known_ends_on_a_stopped_redis(namespace,
                                                                  private_redis) -> None:
    """The App declares the queue's partitions, so its first enqueue reads nothing before
    it registers the queue: the registration, shared by the SyncClient's and the Client's
    enqueues, ends within the deadline too, named by the call the user made."""
    app = obsq.App(namespace=namespace)
    app.queue("declared", partitions=2)
    client = obsq.SyncClient(private_redis.url, namespace, app=app, call_timeout=1)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        client.enqueue("t", "first")  # the memory policy asked, the script loaded
        with stopped(private_redis), pytest.raises(obsq.BrokerTimeout, match="'enqueue'"):
            pool.submit(client.enqueue, "t", "x", queue="declared").result(GUARD)
        assert client.enqueue("t", "after", queue="declared").partition.startswith("declared")
    finally:
        pool.shutdown(wait=False)
        client.close()


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "5", 1e300])
def test_a_call_timeout_that_is_not_a_positive_number_is_refused(value) -> None:
    with pytest.raises(obsq.ConfigurationError, match="call_timeout"):
        obsq.Client("redis://127.0.0.1:1/0", call_timeout=value)


def test_the_call_timeout_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OBSQ_CALL_TIMEOUT", "2.5")
    assert obsq.Client("redis://127.0.0.1:1/0").call_timeout == 2.5
    monkeypatch.setenv("OBSQ_CALL_TIMEOUT", "soon")
    with pytest.raises(obsq.ConfigurationError, match="OBSQ_CALL_TIMEOUT"):
        obsq.Client("redis://127.0.0.1:1/0")


async def test_result_timeout_is_its_own_timeout_error(client) -> None:
    info = await client.enqueue("nobody:runs", 1)
    with pytest.raises(obsq.ResultTimeout) as caught:
        await client.result(info, timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert not isinstance(caught.value, obsq.TaskTimeout)
    assert info.id in str(caught.value)


async def test_a_result_wait_ends_on_its_own_timeout_on_a_stopped_redis(
        namespace, private_redis) -> None:
    """Its clean-up (the task no longer watched) waits for Redis in the background."""
    client = obsq.Client(private_redis.url, namespace, call_timeout=GUARD)
    try:
        info = await client.enqueue("nobody:runs", 1)
        watched = QueueKeys(namespace, info.queue).watched
        waiting = asyncio.ensure_future(client.result(info, timeout=3))
        await wait_until(lambda: sync_redis(private_redis.url).hexists(watched, info.id))
        with stopped(private_redis), pytest.raises(obsq.ResultTimeout):
            await asyncio.wait_for(waiting, GUARD / 2)
        await wait_until(lambda: not sync_redis(private_redis.url).hexists(watched, info.id))
    finally:
        await client.close()


async def test_a_result_wait_begun_on_a_stopped_redis_ends_on_its_own_timeout(
        namespace, private_redis) -> None:
    """Its first call (watching the task) gets no answer: the wait still ends after its own
    timeout, shorter than the call deadline, as the timeout result() was given."""
    client = obsq.Client(private_redis.url, namespace, call_timeout=GUARD)
    try:
        info = await client.enqueue("nobody:runs", 1)
        with stopped(private_redis), pytest.raises(obsq.ResultTimeout, match=info.id):
            await asyncio.wait_for(client.result(info, timeout=1), GUARD / 2)
        assert await client.info(info.id) is not None  # the Client works on afterwards
    finally:
        await client.close()
