"""What an operator reads off /metrics beyond the tasks: Redis's memory against its limit,
whether the last read of the queue-wide gauges worked, enqueues refused by reason, a bounded
`queue` label for producers, no `_created` samples; linted by promtool on a real scrape."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest
import redis
from prometheus_client import REGISTRY
from support import wait_until

import obsq
from obsq.app import OUTCOMES
from obsq.observability import enqueue_metrics, instrument_app
from obsq.observability.metrics import REFUSAL_REASONS

from .helpers import missing_tool, parse, scrape, value

MAXMEMORY = 64 << 20


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_tool("promtool is not on PATH (apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


async def test_redis_memory_and_whether_the_last_read_worked(app, private_redis,
                                                             start_worker) -> None:
    raw = redis.Redis.from_url(private_redis.url)
    raw.config_set("maxmemory", MAXMEMORY)
    began = time.time()
    worker = await start_worker(redis_url=private_redis.url, metrics=True, http_port=0)
    port = start_worker.port(worker)

    text = await asyncio.to_thread(scrape, port)
    s = parse(text)
    used = raw.info("memory")["used_memory"]
    assert value(s, "obsq_redis_memory_max_bytes") == MAXMEMORY
    assert 0.5 * used < value(s, "obsq_redis_memory_used_bytes") < 2 * used
    assert value(s, "obsq_queue_gauges_read_ok") == 1
    read_at = value(s, "obsq_queue_gauges_read_timestamp_seconds")
    assert began <= read_at <= time.time()
    assert "_created" not in text  # counters and histograms without their creation times
    help_line = next(line for line in text.splitlines()
                     if line.startswith("# HELP obsq_tasks_processed_total"))
    assert all(outcome in help_line for outcome in OUTCOMES), help_line
    promtool_check(text)

    private_redis.stop()  # Redis gone: the last values stay a while, and say they are old
    try:
        def failed() -> bool:
            return value(parse(scrape(port)), "obsq_queue_gauges_read_ok") == 0
        await wait_until(lambda: asyncio.to_thread(failed), what="the failed read shown")
        s = parse(await asyncio.to_thread(scrape, port))
        assert value(s, "obsq_queue_gauges_read_timestamp_seconds") >= read_at
        assert value(s, "obsq_redis_memory_max_bytes") == MAXMEMORY  # the last read's
    finally:
        private_redis.start()
    raw.close()


def refused(queue: str, task: str, reason: str) -> float:
    return REGISTRY.get_sample_value("obsq_tasks_refused_total",
                                     {"queue": queue, "task": task, "reason": reason}) or 0


async def test_enqueues_refused_by_reason(app, namespace, private_redis) -> None:
    queue = f"ref-{namespace}"

    @app.task("small", queue=queue, max_payload=10)
    async def small(task):
        return None

    instrument_app(app)
    client = obsq.Client(private_redis.url, app=app)
    for reason in REFUSAL_REASONS:  # each known series starts at 0
        assert REGISTRY.get_sample_value("obsq_tasks_refused_total", {
            "queue": queue, "task": "small", "reason": reason}) == 0
    await client.enqueue("small", "ok", task_id=f"once-{namespace}")
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("small", "ok", task_id=f"once-{namespace}")
    with pytest.raises(obsq.TaskTooLarge):
        await client.enqueue("small", "x" * 100)
    with pytest.raises(ValueError, match="max_retry"):
        await client.enqueue("small", "ok", max_retry=-1)

    raw = redis.Redis.from_url(private_redis.url)
    raw.config_set("maxmemory", int(raw.info("memory")["used_memory"] * 1.5))
    raw.delete(f"{namespace}:{{{queue}}}:memok")  # the room the last enqueue found: read again
    full = obsq.Client(private_redis.url, app=app, memory_share=0.5)
    with pytest.raises(obsq.BrokerError) as refusal:
        await full.enqueue_many([obsq.Job("small", i) for i in range(3)])
    assert refusal.value.out_of_memory
    raw.config_set("maxmemory", 0)
    counts = {reason: refused(queue, "small", reason) for reason in REFUSAL_REASONS}
    assert counts == {"duplicate": 1, "too_large": 1, "invalid": 1, "out_of_memory": 3,
                      "permission_denied": 0, "redis_error": 0}
    assert REGISTRY.get_sample_value("obsq_tasks_enqueued_total",
                                     {"queue": queue, "task": "small"}) == 1
    await full.close()
    await client.close()
    raw.close()


async def test_queue_label_of_producers_is_bounded(app, namespace, redis_url,
                                                   monkeypatch) -> None:
    """Queue names made per tenant: the App's queues and the first OBSQ_METRICS_QUEUES
    others are named, the rest counted as `other`."""
    monkeypatch.setenv("OBSQ_METRICS_QUEUES", "2")
    monkeypatch.setattr(enqueue_metrics, "_labels", None)  # read the setting afresh
    home = f"home-{namespace}"

    @app.task("job", queue=home)
    async def job(task):
        return None

    instrument_app(app)
    client = obsq.Client(redis_url, app=app)

    def enqueued(queue: str) -> float:
        return REGISTRY.get_sample_value("obsq_tasks_enqueued_total",
                                         {"queue": queue, "task": "job"}) or 0
    before = enqueued("other")
    tenants = [f"tenant{n}-{namespace}" for n in range(5)]
    for queue in tenants:
        await client.enqueue("job", queue=queue)
    await client.enqueue("job")
    assert [enqueued(q) for q in tenants[:2]] == [1, 1]
    assert [enqueued(q) for q in tenants[2:]] == [0, 0, 0]
    assert enqueued("other") - before == 3
    assert enqueued(home) == 1  # the App's own queue is always named
    await client.close()


def test_a_wrong_queue_limit_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("OBSQ_METRICS_QUEUES", "many")
    with pytest.raises(obsq.ConfigurationError, match="OBSQ_METRICS_QUEUES"):
        enqueue_metrics.queue_limit()
