"""Log lines carry the trace and span ids of the task they were written for."""

from __future__ import annotations

import io
import json
import logging

import pytest
from support import wait_until

import obsq
from obsq.observability import configure_logging


@pytest.fixture
def log_stream():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def process_spans(spans, queue):
    return [s for s in spans.get_finished_spans() if s.name == f"process {queue}"]


async def test_json_lines_carry_the_task_trace(app, redis_url, namespace, spans, log_stream,
                                               start_worker):
    configure_logging("json", "INFO", stream=log_stream)
    queue = f"logs-{namespace}"
    handler_log = logging.getLogger("shop.tasks")

    @app.task("async", queue=queue)
    async def in_loop(task):
        handler_log.info("charging %s", task.payload["who"], extra={"order": 7})

    @app.task("sync", queue=queue)
    def in_thread(task):  # a plain function: runs in the thread pool, the context follows
        try:
            raise KeyError("gone")
        except KeyError:
            handler_log.exception("lookup failed")

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("async", {"who": "ada"})
    await client.enqueue("sync", {})
    await wait_until(lambda: len(process_spans(spans, queue)) == 2, what="both tasks")
    ids = {s.attributes["obsq.task.type"]: (f"{s.context.trace_id:032x}",
                                            f"{s.context.span_id:016x}")
           for s in process_spans(spans, queue)}
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    mine = {r["message"]: r for r in records if r["logger"] == "shop.tasks"}

    charging = mine["charging ada"]
    assert (charging["trace_id"], charging["span_id"]) == ids["async"]
    assert charging["level"] == "INFO" and charging["order"] == 7
    assert charging["time"].endswith("Z") and "T" in charging["time"]
    failed = mine["lookup failed"]
    assert (failed["trace_id"], failed["span_id"]) == ids["sync"]
    assert failed["level"] == "ERROR" and "KeyError: 'gone'" in failed["exc_info"]
    outside = [r for r in records if r["logger"] == "obsq" and "started" in r["message"]]
    assert outside and "trace_id" not in outside[0]  # no span, no ids
    await client.close()


async def test_text_lines_end_with_the_ids(app, redis_url, namespace, spans, log_stream,
                                           start_worker):
    configure_logging("text", "INFO", stream=log_stream)
    configure_logging("text", "INFO", stream=log_stream)  # again: one handler, not two
    queue = f"text-{namespace}"

    @app.task("t", queue=queue)
    async def t(task):
        logging.getLogger("shop").warning("hello from the handler")

    await start_worker(queues={queue: 1}, tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("t")
    (span,) = await wait_until(lambda: process_spans(spans, queue))
    lines = [line for line in log_stream.getvalue().splitlines() if "hello from" in line]
    assert lines == [lines[0]]
    assert lines[0].endswith(f"WARNING shop: hello from the handler "
                             f"trace_id={span.context.trace_id:032x} "
                             f"span_id={span.context.span_id:016x}")
    await client.close()
