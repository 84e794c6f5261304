"""What groups and events show: obsq_aggregations_total by outcome, the aggregating depth,
obsq_event_deliveries_total by subscriber, each series at 0 from the start, and the trace
of each event copy, a new one linked to the publisher's send span."""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from support import wait_until

import obsq

from .helpers import parse, pick, scrape, value

tracer = trace.get_tracer("tests")


async def test_aggregations_deliveries_and_depth(app, client, namespace, start_worker) -> None:
    queue = f"fan-{namespace}"
    runs = {"n": 0}

    @app.task("rows:sum", queue=queue)
    async def total(task: obsq.Task) -> int:
        return sum(task.payload)

    def aggregator(group: str, tasks: list[obsq.Task]) -> tuple[str, list[int]]:
        runs["n"] += 1
        if runs["n"] == 1:
            raise ValueError("first run fails")
        return "rows:sum", [t.payload for t in tasks]

    app.aggregate("rows:", aggregator, max_size=50, max_delay=30, grace_period=0.2)

    @app.subscribe("user.joined", name="welcome", queue=queue)
    async def welcome(task: obsq.Task) -> None:
        if task.retry_count == 0:
            raise RuntimeError("once")

    for n in range(4):
        await client.enqueue("rows:add", n, queue=queue, group="g")
    worker = await start_worker(queues={queue: 1}, metrics=True, http_port=0)
    port = start_worker.port(worker)
    s = parse(await asyncio.to_thread(scrape, port))
    assert value(s, "obsq_event_deliveries_total", event="user.joined", subscriber="welcome",
                 outcome="dead") == 0
    assert value(s, "obsq_aggregations_total", queue=queue, task="rows:",
                 outcome="success") == 0
    assert value(s, "obsq_queue_depth", queue=queue, state="aggregating") == 4
    await client.publish("user.joined", {"user": 1})

    def counted() -> bool:
        s = parse(scrape(port))
        return (value(s, "obsq_aggregations_total", queue=queue, task="rows:",
                      outcome="failed") == 1
                and value(s, "obsq_aggregations_total", queue=queue, task="rows:",
                          outcome="success") == 1
                and value(s, "obsq_event_deliveries_total", event="user.joined",
                          subscriber="welcome", outcome="success") == 1
                and value(s, "obsq_queue_depth", queue=queue, state="aggregating") == 0)

    await wait_until(lambda: asyncio.to_thread(counted), timeout=20, what="counted")
    s = parse(await asyncio.to_thread(scrape, port))
    deliveries = {dict(k)["outcome"]: v for k, v in pick(
        s, "obsq_event_deliveries_total", subscriber="welcome").items() if v}
    assert deliveries == {"retry": 1, "success": 1}
    assert value(s, "obsq_tasks_processed_total", queue=queue, task="user.joined@welcome",
                 outcome="success") == 1


async def test_each_event_copy_starts_a_trace_linked_to_its_send(app, redis_url, namespace,
                                                                 spans, start_worker) -> None:
    queue = f"ev-{namespace}"

    @app.subscribe("invoice.paid", name="ledger", queue=queue)
    async def ledger(task: obsq.Task) -> None:
        return None

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    try:
        with tracer.start_as_current_span("pay") as caller:
            [info] = await client.publish("invoice.paid", {"id": 7})
    finally:
        await client.close()
    await wait_until(lambda: [s for s in spans.get_finished_spans()
                              if s.name == f"process {queue}"], what="the process span")
    send = next(s for s in spans.get_finished_spans() if s.name == f"send {queue}")
    process = next(s for s in spans.get_finished_spans() if s.name == f"process {queue}")
    assert send.context.trace_id == caller.get_span_context().trace_id
    assert process.context.trace_id != send.context.trace_id and process.parent is None
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert process.attributes["obsq.task.type"] == "invoice.paid@ledger"
    assert info.headers["obsq-subscriber"] == "ledger"


async def test_an_aggregated_task_links_to_the_traces_of_its_grouped_tasks(
        app, redis_url, namespace, spans, start_worker) -> None:
    queue = f"agg-{namespace}"

    @app.task("parts:joined", queue=queue)
    async def joined(task: obsq.Task) -> None:
        return None

    app.aggregate("parts:add", lambda group, tasks: ("parts:joined", len(tasks)),
                  max_size=2, grace_period=30)
    await start_worker(queues={queue: 1}, tracing=True)  # its App's producers trace too
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    try:
        for n in range(2):
            with tracer.start_as_current_span(f"request {n}"):
                await client.enqueue("parts:add", n, queue=queue, group="g")
    finally:
        await client.close()

    def finished(name: str) -> list:
        return [s for s in spans.get_finished_spans() if s.name == name]

    await wait_until(lambda: finished(f"process {queue}"), what="the aggregated task ran")
    grouped, made = [], None
    for span in finished(f"send {queue}"):
        if span.attributes["obsq.task.type"] == "parts:add":
            grouped.append(span)
        else:
            made = span
    assert made is not None and len(grouped) == 2
    assert {link.context.span_id for link in made.links} == {
        s.context.span_id for s in grouped}
    assert made.context.trace_id not in {s.context.trace_id for s in grouped}
