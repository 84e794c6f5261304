"""The probes and the queue gauges under trouble: Redis down and back, an event loop
blocked by a careless handler, a draining worker, a Redis too slow for a scrape."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time

from prometheus_client import CollectorRegistry
from support import wait_until

import obsq
from obsq.broker import Broker
from obsq.engine.liveness import LoopMonitor
from obsq.observability.collector import QueueCollector
from obsq.observability.http import HealthServer

from .helpers import http_get, parse, probe, scrape, value


async def test_readiness_follows_redis_down_and_back(app, private_redis, namespace,
                                                     start_worker):
    worker = await start_worker(redis_url=private_redis.url, metrics=True, http_port=0)
    port = start_worker.port(worker)
    assert await asyncio.to_thread(probe, port, "/readyz") == (200, {"status": "ok"})
    assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200

    private_redis.stop()
    _, body = await wait_until(
        lambda: asyncio.to_thread(lambda: (r := probe(port, "/readyz"))[0] == 503 and r),
        timeout=10, what="readyz 503")
    assert body == {"status": "unavailable", "reason": "Redis is unreachable"}
    # a short outage is no reason to restart the pod: liveness stays up
    assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200
    errors = parse(await asyncio.to_thread(scrape, port))
    assert value(errors, "obsq_redis_errors_total", operation="heartbeat") >= 1

    private_redis.start()
    await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/readyz")[0] == 200),
                     timeout=15, what="readyz 200 again")
    assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200


async def test_liveness_fails_while_the_event_loop_is_blocked_past_its_limit(
        app, redis_url, namespace, start_worker):
    @app.task("careless")
    async def careless(task):
        time.sleep(3)  # blocks the event loop: the bug liveness must catch

    worker = await start_worker(http_port=0, blocked_loop_limit=1.0)
    port = start_worker.port(worker)
    seen: list[tuple[float, int, dict]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            status, body = probe(port, "/healthz")
            seen.append((time.monotonic(), status, body))
            time.sleep(0.1)

    poller = threading.Thread(target=poll)
    poller.start()
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    try:
        await client.enqueue("careless")
        await asyncio.sleep(0.5)  # the handler has run and blocked the loop for 3 s by now
        await wait_until(lambda: any(s == 503 for _, s, _ in seen) and seen[-1][1] == 200,
                         timeout=15, what="503 then 200")
    finally:
        stop.set()
        await asyncio.to_thread(poller.join)
        await client.close()
    statuses = [s for _, s, _ in seen]
    first_bad = statuses.index(503)
    assert 200 in statuses[first_bad:]
    assert next(b for _, s, b in seen if s == 503)["reason"].startswith(
        "the event loop has been blocked for")


async def test_liveness_holds_while_the_event_loop_is_blocked_within_its_limit(
        app, redis_url, namespace, start_worker):
    """A loop blocked for seconds is logged and measured, not a reason to restart the pod:
    liveness fails only past blocked_loop_limit (60 s by default)."""
    @app.task("careless")
    async def careless(task):
        time.sleep(4)

    worker = await start_worker(http_port=0, metrics=True)
    port = start_worker.port(worker)
    seen: list[tuple[int, float]] = []  # (/healthz status, lag gauge)
    stop = threading.Event()

    def poll() -> None:  # a thread: the test shares the blocked loop
        while not stop.is_set():
            seen.append((probe(port, "/healthz")[0], value(
                parse(scrape(port)), "obsq_worker_event_loop_lag_seconds")))
            time.sleep(0.2)

    poller = threading.Thread(target=poll)
    poller.start()
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    try:
        await client.enqueue("careless")
        await wait_until(lambda: any(lag > 2 for _, lag in seen) and seen[-1][1] < 1,
                         timeout=20, what="the lag rising past 2 s and falling again")
    finally:
        stop.set()
        await asyncio.to_thread(poller.join)
        await client.close()
    assert {status for status, _ in seen} == {200}


async def test_readiness_fails_while_draining_and_status_page(app, redis_url, namespace,
                                                              start_worker):
    started = asyncio.Event()

    @app.task("long")
    async def long(task):
        started.set()
        await asyncio.sleep(1.5)

    worker = await start_worker(http_port=0, shutdown_timeout=10)
    port = start_worker.port(worker)
    status, page = await asyncio.to_thread(probe, port, "/")
    assert status == 200
    assert page["worker"] == worker.id and page["queues"] == {"default": 1}
    assert page["concurrency"] == 10 and page["busy"] == 0 and page["version"]
    assert 0 <= page["heartbeat_age"] < 5
    assert (await asyncio.to_thread(http_get, port, "/nope"))[0] == 404

    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("long")
    await started.wait()
    assert (await asyncio.to_thread(probe, port, "/"))[1]["busy"] == 1
    worker.stop()
    status, body = await asyncio.to_thread(probe, port, "/readyz")
    assert (status, body["reason"]) == (503, "the worker is draining")
    await client.close()


class SlowBroker:
    """The real broker, whose queue_stats can be made to hang, and counted."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.hang = False
        self.calls = 0
        self.hanging = 0  # reads started and not answered

    async def queue_stats(self, queues):
        self.calls += 1
        if self.hang:
            self.hanging += 1
            await asyncio.Event().wait()  # a Redis that never answers
        return await self.broker.queue_stats(queues)

    async def queues(self):
        return await self.broker.queues()

    async def partition_counts(self, queues):
        return await self.broker.partition_counts(queues)

    async def workers(self):
        return await self.broker.workers()

    async def memory_policy(self):
        return await self.broker.memory_policy()

    async def memory_usage(self):
        return await self.broker.memory_usage()


async def test_a_slow_redis_never_hangs_a_scrape(redis_url, namespace):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(redis_url, namespace)
    slow = SlowBroker(broker)
    collector = QueueCollector(slow, loop, ["q1"], cache_seconds=0.5, timeout=0.5)

    def depth():
        families = {f.name: f for f in collector.collect()}
        return {s.labels["state"]: s.value for s in families["obsq_queue_depth"].samples} \
            if families else None

    try:
        assert (await asyncio.to_thread(depth))["pending"] == 0
        assert await asyncio.to_thread(depth) and slow.calls == 1  # cached
        slow.hang = True
        await asyncio.sleep(0.6)  # past the cache
        # the scrape answers, with the last values, while its read still hangs
        assert (await asyncio.to_thread(depth))["pending"] == 0
        assert slow.hanging == 1
        calls = slow.calls
        results = await asyncio.gather(*(asyncio.to_thread(depth) for _ in range(5)))
        assert all(r is not None for r in results)
        assert slow.calls == calls  # no new attempt before the cache would expire
    finally:
        slow.hang = False
        asyncio.run_coroutine_threadsafe(broker.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    # a loop that is gone: the collector serves what it had, without asking Redis
    calls = slow.calls
    assert await asyncio.to_thread(depth) is not None
    assert slow.calls == calls


async def test_a_redis_restarted_empty_is_said_as_lost_data_and_counted(
        app, private_redis, namespace, start_worker, caplog):
    started = asyncio.Event()

    @app.task("long")
    async def long(task):
        started.set()
        await asyncio.sleep(4)

    @app.task("quick")
    async def quick(task):
        return "ran"

    worker = await start_worker(redis_url=private_redis.url, metrics=True, http_port=0)
    port = start_worker.port(worker)
    client = obsq.Client(private_redis.url, namespace, app=app)
    try:
        await client.enqueue("long")
        await wait_until(started.is_set)
        assert "lost its data" not in caplog.text
        before = value(parse(await asyncio.to_thread(scrape, port)),
                       "obsq_redis_data_lost_total")  # the process's, over earlier tests
        private_redis.stop()  # killed: no persistence, so it comes back empty
        await asyncio.sleep(1)
        private_redis.start()
        await wait_until(lambda: "lost its data" in caplog.text, timeout=15)
        lost = [r for r in caplog.records if "lost its data (" in r.getMessage()]
        assert len(lost) == 1 and lost[0].levelname == "ERROR"
        assert "restarted without persistence" in lost[0].getMessage()
        samples = parse(await asyncio.to_thread(scrape, port))
        assert value(samples, "obsq_redis_data_lost_total") == before + 1
        # it carries on: queues registered again, new tasks run
        async with obsq.Client(private_redis.url, namespace, app=app) as after:
            info = await after.enqueue("quick", retention=60)
            assert await after.result(info, timeout=15) == "ran"
        taken = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
        assert all("Redis lost its data" in m for m in taken), taken
    finally:
        await client.close()


async def test_a_probe_that_leaves_before_its_answer_leaves_no_traceback(capsys, caplog):
    """A probe timing out closes its connection before the check answers: the endpoint
    then cannot write its reply, which is nobody's error."""
    def slow() -> None:
        time.sleep(0.5)

    server = HealthServer("127.0.0.1", 0, CollectorRegistry(), live=slow, ready=slow,
                          status=dict)
    try:
        for path in ("/healthz", "/readyz"):
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                # reset at once, as a client whose timeout ran out
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await asyncio.sleep(1)
        assert probe(server.port, "/healthz")[0] == 200  # still serving
    finally:
        server.close()
    output = capsys.readouterr()
    assert "Traceback" not in output.err + output.out
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_a_blocked_loop_is_named_not_redis_and_no_last_values_are_claimed(
        redis_url, namespace, caplog):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(redis_url, namespace)

    async def started_monitor() -> LoopMonitor:
        monitor = LoopMonitor(asyncio.get_running_loop())
        monitor.start()
        return monitor

    monitor = asyncio.run_coroutine_threadsafe(started_monitor(), loop).result(5)
    collector = QueueCollector(broker, loop, ["q1"], timeout=1, loop_lag=monitor.lag)
    try:
        loop.call_soon_threadsafe(time.sleep, 4)  # an async handler calling time.sleep
        families = {f.name: f for f in await asyncio.to_thread(collector.collect)}
        assert families["obsq_queue_gauges_read_ok"].samples[0].value == 0
        assert "obsq_queue_depth" not in families
        assert "has been blocked for" in caplog.text and "Redis was not the cause" in \
            caplog.text, caplog.text
        assert "Redis did not answer" not in caplog.text
        assert "serving none until a read works" in caplog.text
        assert "serving the last values" not in caplog.text
    finally:
        asyncio.run_coroutine_threadsafe(broker.close(), loop).result(10)
        loop.call_soon_threadsafe(monitor.stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
