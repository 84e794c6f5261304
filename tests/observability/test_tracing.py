"""Spans of a real worker and client, read from an in-memory exporter: one trace from the
caller through `send {queue}` to `process {queue}`, the messaging attributes, errors,
retries, links instead of parents, and a span ended whatever the outcome."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import REGISTRY
from support import wait_until

import obsq
from obsq.broker import QueueKeys
from obsq.observability import instrument_app, instrument_client
from obsq.observability.enqueue_metrics import EnqueueMetrics

from .helpers import parse, scrape, value

tracer = trace.get_tracer("tests")


def named(spans, name):
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_one_trace_from_the_caller_to_the_handler(app, redis_url, namespace, spans,
                                                        start_worker):
    """enqueue_many as the messaging conventions trace a batch: a `create` span per message
    (the context it carries), one `send` CLIENT span linked to them with the batch's size;
    each process span is the child of its message's create span, and linked to it. The
    Client was instrumented through its App, and its spans still name its Redis and id."""
    queue = f"tr-{namespace}"
    seen = {}

    @app.task("greet", queue=queue)
    async def greet(task):
        seen[task.id] = trace.get_current_span().get_span_context()
        return "hi"

    worker = await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    with tracer.start_as_current_span("checkout") as caller:
        infos = await client.enqueue_many([obsq.Job("greet", {"n": i}) for i in range(3)])
    await wait_until(lambda: len(named(spans, f"process {queue}")) == 3, what="3 spans")

    root = caller.get_span_context()
    (send,) = named(spans, f"send {queue}")
    creates = {s.attributes["messaging.message.id"]: s for s in named(spans, f"create {queue}")}
    processes = {s.attributes["messaging.message.id"]: s
                 for s in named(spans, f"process {queue}")}
    assert set(creates) == set(processes) == {i.id for i in infos}
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    named_client = {"messaging.client.id": client.results.client_id,
                    "server.address": "127.0.0.1", "server.port": port}
    assert send.kind == SpanKind.CLIENT and send.parent.span_id == root.span_id
    assert send.instrumentation_scope.schema_url == "https://opentelemetry.io/schemas/1.27.0"
    assert dict(send.attributes) == {
        "messaging.system": "obsq", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": queue,
        "messaging.batch.message_count": 3, **named_client}
    assert {link.context.span_id for link in send.links} == {
        c.context.span_id for c in creates.values()}
    for info in infos:
        create, process = creates[info.id], processes[info.id]
        assert create.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
        # every create span is a child of the caller, not of the previous one
        assert create.parent.span_id == root.span_id
        assert create.context.trace_id == process.context.trace_id == root.trace_id
        assert process.parent.span_id == create.context.span_id
        assert [link.context.span_id for link in process.links] == [create.context.span_id]
        assert info.headers["traceparent"].startswith(
            f"00-{root.trace_id:032x}-{create.context.span_id:016x}-")
        assert dict(create.attributes) == {
            "messaging.system": "obsq", "messaging.operation.name": "create",
            "messaging.operation.type": "create", "messaging.destination.name": queue,
            "messaging.message.id": info.id, "obsq.task.type": "greet", **named_client}
        assert dict(process.attributes) == {
            "messaging.system": "obsq", "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue, "messaging.message.id": info.id,
            "messaging.client.id": worker.id, "server.address": "127.0.0.1",
            "server.port": port, "obsq.task.type": "greet", "obsq.task.retry_count": 0,
            "obsq.task.outcome": "success"}
        assert process.status.status_code == StatusCode.UNSET
        assert seen[info.id].span_id == process.context.span_id  # the handler runs inside
        assert process.end_time >= process.start_time
    await client.close()


async def test_one_message_one_send_span_naming_the_client(redis_url, namespace,
                                                           spans) -> None:
    """A single enqueue: one `send` span, the context the message carries, with the Client's
    Redis and id, and no batch count."""
    client = instrument_client(obsq.Client(redis_url, namespace=namespace))
    info = await client.enqueue("lone", queue=f"one-{namespace}")
    (send,) = named(spans, f"send one-{namespace}")
    assert send.attributes["messaging.operation.name"] == "send"
    assert send.attributes["messaging.message.id"] == info.id
    assert send.attributes["messaging.client.id"] == client.results.client_id
    assert send.attributes["server.address"] == "127.0.0.1"
    assert "messaging.batch.message_count" not in send.attributes
    assert info.headers["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"
    assert not named(spans, f"create one-{namespace}")
    await client.close()


async def test_a_batch_without_create_spans_carries_its_send_span(redis_url, namespace,
                                                                   spans, monkeypatch) -> None:
    """OBSQ_TRACE_CREATE_SPANS=false: a batch is one `send` PRODUCER span, whose context
    every message carries, and no create span."""
    monkeypatch.setenv("OBSQ_TRACE_CREATE_SPANS", "false")
    client = instrument_client(obsq.Client(redis_url, namespace=namespace))
    queue = f"nocreate-{namespace}"
    infos = await client.enqueue_many([obsq.Job("x", i, queue=queue) for i in range(3)])
    (send,) = named(spans, f"send {queue}")
    assert send.kind == SpanKind.PRODUCER and not send.links
    assert send.attributes["messaging.batch.message_count"] == 3
    assert not named(spans, f"create {queue}")
    for info in infos:
        assert info.headers["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"
    await client.close()


async def test_a_partitioned_queue_names_the_partition(app, redis_url, namespace, spans,
                                                       start_worker) -> None:
    """The process span of a task of a partitioned queue: messaging.destination.name is the
    queue, messaging.destination.partition.id its partition's index."""
    queue = f"parted-{namespace}"
    app.queue(queue, partitions=2)

    @app.task("part", queue=queue)
    async def part(task):
        return None

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue_many([obsq.Job("part", i) for i in range(6)])
    await wait_until(lambda: len(named(spans, f"process {queue}")) == 6, what="6 spans")
    processes = named(spans, f"process {queue}")
    assert {s.attributes["messaging.destination.name"] for s in processes} == {queue}
    assert {s.attributes["messaging.destination.partition.id"] for s in processes} <= {"0", "1"}
    await client.close()


async def test_failures_record_the_exception_and_each_retry(app, redis_url, namespace, spans,
                                                           start_worker):
    queue = f"fail-{namespace}"

    @app.task("boom", queue=queue, max_retry=1, retry_delay=0)
    async def boom(task):
        raise ValueError("card declined")

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    info = await client.enqueue("boom")
    await wait_until(lambda: len(named(spans, f"process {queue}")) == 2, what="2 attempts")
    first, second = sorted(named(spans, f"process {queue}"),
                           key=lambda s: s.attributes["obsq.task.retry_count"])
    (send,) = named(spans, f"send {queue}")
    for span, outcome in ((first, "retry"), (second, "dead")):
        assert span.parent.span_id == send.context.span_id
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == "card declined"  # the type is in error.type
        assert span.attributes["error.type"] == "ValueError"
        assert [e.name for e in span.events] == ["exception", outcome]
        assert span.events[0].attributes["exception.type"] == "ValueError"
        assert span.events[0].attributes["exception.message"] == "card declined"
        assert span.attributes["obsq.task.outcome"] == outcome
    assert second.attributes["obsq.task.retry_count"] == 1
    assert (await client.info(info.id)).state == "dead"
    await client.close()


async def test_a_link_instead_of_a_parent_when_asked(app, redis_url, namespace, spans,
                                                     monkeypatch, start_worker):
    monkeypatch.setenv("OBSQ_TRACE_LINK", "true")
    queue = f"link-{namespace}"

    @app.task("linked", queue=queue)
    async def linked(task):
        return None

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("linked")
    (process,) = await wait_until(lambda: named(spans, f"process {queue}"))
    (send,) = named(spans, f"send {queue}")
    assert process.parent is None
    assert process.context.trace_id != send.context.trace_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert process.links[0].context.trace_id == send.context.trace_id
    await client.close()


async def test_span_and_count_end_once_for_a_task_handed_back_at_shutdown(
        app, redis_url, namespace, spans, start_worker):
    queue = f"req-{namespace}"
    started = asyncio.Event()

    @app.task("forever", queue=queue)
    async def forever(task):
        started.set()
        await asyncio.sleep(3600)

    worker = await start_worker(queues={queue: 1}, tracing=True, metrics=True, http_port=0,
                                shutdown_timeout=0.2)
    port = start_worker.port(worker)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    info = await client.enqueue("forever")
    await started.wait()
    before = parse(await asyncio.to_thread(scrape, port))
    assert value(before, "obsq_tasks_in_progress", queue=queue, task="forever") == 1
    worker.stop()
    (process,) = await wait_until(lambda: named(spans, f"process {queue}"))
    assert process.attributes["obsq.task.outcome"] == "requeued"
    assert process.status.status_code == StatusCode.UNSET  # cancelled, not failed
    assert [e.name for e in process.events] == ["requeued"]
    assert (await client.info(info.id)).state == "pending"
    labels = {"queue": queue, "task": "forever"}
    assert REGISTRY.get_sample_value("obsq_tasks_in_progress", labels) == 0
    counts = {o: REGISTRY.get_sample_value("obsq_tasks_processed_total", {**labels,
                                                                          "outcome": o})
              for o in ("success", "retry", "dead", "requeued", "lease_lost")}
    assert counts == {"success": 0, "retry": 0, "dead": 0, "requeued": 1, "lease_lost": 0}
    await client.close()


async def test_span_ends_when_the_lease_was_lost(app, redis_url, namespace, spans, raw_redis,
                                                 start_worker):
    queue = f"ll-{namespace}"
    release = asyncio.Event()
    attempts = []

    @app.task("held", queue=queue)
    async def held(task):
        attempts.append(task.id)
        if len(attempts) == 1:
            await release.wait()

    await start_worker(queues={queue: 1}, tracing=True, lease_seconds=60)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    info = await client.enqueue("held")
    await wait_until(lambda: attempts)
    raw_redis.zadd(QueueKeys(namespace, queue).lease, {info.id: 1})  # expired: taken back
    await wait_until(lambda: len(attempts) == 2, what="the second attempt")
    release.set()
    await wait_until(lambda: len(named(spans, f"process {queue}")) == 2, what="both spans")
    outcomes = sorted(s.attributes["obsq.task.outcome"]
                      for s in named(spans, f"process {queue}"))
    assert outcomes == ["lease_lost", "success"]
    lost = next(s for s in named(spans, f"process {queue}")
                if s.attributes["obsq.task.outcome"] == "lease_lost")
    assert [e.name for e in lost.events] == ["lease_lost"]
    await client.close()


async def test_a_worker_without_tracing_adds_no_trace_context(app, client, start_worker,
                                                              spans) -> None:
    """--no-tracing means none: with a tracer provider set in the process, the enqueues of
    the App's clients carry no traceparent and make no send span, and are still counted."""
    await start_worker(metrics=True, tracing=False)
    with tracer.start_as_current_span("request"):
        info = await client.enqueue("anything", {})
    assert "traceparent" not in info.headers
    assert not named(spans, "send default")
    app_hooks, _ = client.producer_hooks
    assert [type(hook.__self__) for hook in app_hooks] == [EnqueueMetrics]


async def test_sync_client_sends_from_the_callers_context(app, redis_url, namespace, spans):
    queue = f"sync-{namespace}"
    box = {}

    instrument_app(app)  # its clients make send spans

    def produce():
        with obsq.SyncClient(redis_url, namespace, app=app) as client, \
                tracer.start_as_current_span("request") as span:
            box["info"] = client.enqueue("anything", {}, queue=queue)
            box["root"] = span.get_span_context()

    thread = threading.Thread(target=produce)
    thread.start()
    await asyncio.to_thread(thread.join)
    (send,) = named(spans, f"send {queue}")
    assert send.parent.span_id == box["root"].span_id
    assert send.context.trace_id == box["root"].trace_id
    assert box["info"].headers["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"


async def test_coalesced_enqueues_each_keep_their_callers_trace(app, redis_url, namespace,
                                                               spans) -> None:
    """Enqueues that ride in one script call still each get a send span that is a child of
    their own caller's span, and that caller's trace in their headers; a SyncClient, which
    enqueues in the caller's thread, too."""
    instrument_app(app)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("warm-up")

    async def request(n: int) -> tuple[trace.SpanContext, obsq.TaskInfo]:
        with tracer.start_as_current_span(f"request {n}") as caller:
            return caller.get_span_context(), await client.enqueue("job", n)

    results = await asyncio.gather(*(request(n) for n in range(100)))
    sends = {s.attributes["messaging.message.id"]: s for s in named(spans, "send default")}
    for caller, info in results:
        send = sends[info.id]
        assert send.parent.span_id == caller.span_id
        assert send.context.trace_id == caller.trace_id
        assert info.headers["traceparent"].startswith(
            f"00-{caller.trace_id:032x}-{send.context.span_id:016x}-")
    await client.close()

    def sync_request() -> tuple[trace.SpanContext, obsq.TaskInfo]:
        with obsq.SyncClient(redis_url, namespace=namespace, app=app) as sync, \
                tracer.start_as_current_span("sync request") as caller:
            return caller.get_span_context(), sync.enqueue("job", "sync")

    caller, info = await asyncio.to_thread(sync_request)
    (send,) = [s for s in named(spans, "send default")
               if s.attributes["messaging.message.id"] == info.id]
    assert send.parent.span_id == caller.span_id and send.context.trace_id == caller.trace_id


async def test_a_failed_send_says_its_error_type(namespace, private_redis, spans) -> None:
    client = instrument_client(obsq.Client(private_redis.url, namespace=namespace))
    await client.enqueue("first")  # the queue is known; then Redis goes away
    private_redis.stop()
    try:
        with pytest.raises(obsq.BrokerError):
            await client.enqueue("second")
    finally:
        private_redis.start()
    failed = [s for s in named(spans, "send default") if s.status.status_code == StatusCode.ERROR]
    (send,) = failed
    assert send.attributes["error.type"] == "obsq.errors.BrokerError"
    assert "BrokerError" not in send.status.description  # the message, not the type again
    await client.close()


async def test_a_debounced_task_runs_in_the_trace_of_its_last_enqueue(app, redis_url, namespace,
                                                                     spans, start_worker):
    """Each enqueue of a burst has its send span; a replacing one names the waiting task,
    and the task's process span is the child of the last send, whose headers it kept."""
    queue = f"db-{namespace}"

    @app.task("doc", queue=queue)
    async def doc(task):
        return None

    client = instrument_client(obsq.Client(redis_url, namespace=namespace, app=app))
    first, last = [await client.enqueue("doc", n, debounce_key="k", debounce=0.2)
                   for n in range(2)]
    opening, replacing = named(spans, f"send {queue}")
    assert "obsq.task.debounced" not in opening.attributes
    assert replacing.attributes["obsq.task.debounced"] == first.id == last.id
    await start_worker(queues={queue: 1}, tracing=True)
    await wait_until(lambda: named(spans, f"process {queue}"), what="the process span")
    (process,) = named(spans, f"process {queue}")
    assert process.parent.span_id == replacing.context.span_id
    await client.close()
