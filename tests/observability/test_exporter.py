"""`obsq exporter`: the queue-wide gauges of every queue in Redis, and nothing else."""

from __future__ import annotations

import asyncio

from support import ObsqProcess, obsq_env, wait_until

import obsq
from obsq.redis_server import free_port

from .helpers import parse, pick, probe, scrape, value, wait_ready


async def test_exporter_serves_every_queue(redis_url, namespace, tmp_path):
    client = obsq.Client(redis_url, namespace=namespace)
    await client.enqueue("a", {}, queue="alpha")
    await client.enqueue("b", {}, queue="beta")
    await client.enqueue("b", {}, queue="beta", delay=600)
    port = free_port()
    exporter = ObsqProcess(["exporter", "--http-port", str(port)],
                          obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace),
                          tmp_path, tmp_path / "exporter.log")
    try:
        assert await wait_ready(port) == {"status": "ok"}
        assert await asyncio.to_thread(probe, port, "/healthz") == (200, {"status": "ok"})
        s = parse(await asyncio.to_thread(scrape, port))
        assert value(s, "obsq_queue_depth", queue="alpha", state="pending") == 1
        assert value(s, "obsq_queue_depth", queue="beta", state="pending") == 1
        assert value(s, "obsq_queue_depth", queue="beta", state="scheduled") == 1
        assert len(pick(s, "obsq_queue_depth")) == 16  # 2 queues x 8 states
        assert value(s, "obsq_queue_paused", queue="alpha") == 0
        assert 0 <= value(s, "obsq_queue_latency_seconds", queue="alpha") < 60
        assert value(s, "obsq_workers") == 0
        assert value(s, "obsq_redis_maxmemory_policy_ok") == 1  # the tests' Redis: noeviction
        assert value(s, "obsq_queue_gauges_read_ok") == 1
        assert value(s, "obsq_redis_memory_used_bytes") > 0
        assert {name for name, _ in s} == {"obsq_queue_depth", "obsq_queue_latency_seconds",
                                           "obsq_queue_paused", "obsq_queue_partitions",
                                           # no key waits: a count of 0, no key's series
                                           "obsq_queue_fairness_keys",
                                           "obsq_workers",
                                           "obsq_redis_maxmemory_policy_ok",
                                           "obsq_redis_memory_used_bytes",
                                           "obsq_redis_memory_max_bytes",
                                           "obsq_queue_gauges_read_ok",
                                           "obsq_queue_gauges_read_timestamp_seconds"}

        await client.enqueue("c", {}, queue="gamma")  # a new queue shows up
        await wait_until(lambda: asyncio.to_thread(lambda: value(
            parse(scrape(port)), "obsq_queue_depth", queue="gamma", state="pending") == 1))
    finally:
        await client.close()
        code = await asyncio.to_thread(exporter.stop)
    assert code == 0, (tmp_path / "exporter.log").read_text()


async def test_exporter_takes_its_settings_from_the_chart_environment(redis_url, namespace,
                                                                      tmp_path):
    # The Helm chart passes no flags: only OBSQ_REDIS_URL, OBSQ_NAMESPACE, OBSQ_HTTP_PORT
    # and the log settings (deploy/helm/obsq/templates/exporter-deployment.yaml).
    client = obsq.Client(redis_url, namespace=namespace)
    await client.enqueue("a", {}, queue="alpha")
    port = free_port()
    exporter = ObsqProcess(["exporter"],
                          obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                                   OBSQ_HTTP_PORT=str(port), OBSQ_LOG_FORMAT="json",
                                   OBSQ_LOG_LEVEL="INFO"),
                          tmp_path, tmp_path / "exporter.log")
    try:
        assert await wait_ready(port) == {"status": "ok"}
        assert await asyncio.to_thread(probe, port, "/healthz") == (200, {"status": "ok"})
        s = parse(await asyncio.to_thread(scrape, port))
        assert value(s, "obsq_queue_depth", queue="alpha", state="pending") == 1
    finally:
        await client.close()
        code = await asyncio.to_thread(exporter.stop)
    assert code == 0, (tmp_path / "exporter.log").read_text()
    assert '"message":"exporter serving' in (tmp_path / "exporter.log").read_text()
