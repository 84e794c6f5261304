"""The examples run end to end: a worker for examples.tasks and the producer as the
commands the README gives, and the FastAPI app whose request, enqueue and task make one
trace."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys

import httpx
import pytest
from opentelemetry.trace import SpanKind
from support import ObsqProcess, obsq_env, wait_until

from .helpers import ROOT


async def test_worker_and_producer(redis_url, namespace, tmp_path):
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace)
    worker = ObsqProcess(["worker", "examples.tasks:app", "--queues", "default=3,reports=1",
                         "--http-port", "-1"], env, ROOT, tmp_path / "worker.log")
    try:
        produced = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "examples.producer"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=60)
    finally:
        code = await asyncio.to_thread(worker.stop)
    assert produced.returncode == 0, produced.stderr
    assert "enqueued 3 emails" in produced.stdout
    assert "report ready: {'report': 'monthly', 'month': '2026-11', 'rows': 42}" in \
        produced.stdout
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert log.count("mail sent") == 3, log


@pytest.fixture
def examples(monkeypatch, redis_url, namespace):
    """The example modules imported afresh for this test's Redis and namespace."""
    monkeypatch.setenv("OBSQ_REDIS_URL", redis_url)
    monkeypatch.setenv("OBSQ_NAMESPACE", namespace)
    monkeypatch.syspath_prepend(str(ROOT))

    def forget():
        for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
            del sys.modules[name]
    forget()
    yield importlib
    forget()


async def test_web_request_enqueue_and_task_make_one_trace(examples, spans, start_worker):
    webapp = examples.import_module("examples.webapp")
    tasks = examples.import_module("examples.tasks")
    await start_worker(worker_app=tasks.app, queues={"default": 3, "reports": 1},
                       tracing=True, metrics=True)
    transport = httpx.ASGITransport(app=webapp.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://web") as http:
        reply = await http.post("/reports/monthly", params={"month": "2026-11"})
        assert reply.status_code == 202, reply.text
        task_id = reply.json()["task_id"]

        async def done():
            state = (await http.get(f"/tasks/{task_id}")).json()
            return state["state"] == "completed" and state
        state = await wait_until(done, timeout=20, what="the report task completed")
        assert state["result"] == {"report": "monthly", "month": "2026-11", "rows": 42}
        assert (await http.get("/tasks/nope")).status_code == 404
    await webapp.client.close()

    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if s.kind == SpanKind.SERVER
                 and s.name == "POST /reports/{kind}"]
    (send,) = [s for s in finished if s.name == "send reports"]
    (process,) = [s for s in finished if s.name == "process reports"]
    assert send.context.trace_id == server.context.trace_id == process.context.trace_id
    assert send.parent.span_id == server.context.span_id
    assert process.parent.span_id == send.context.span_id
    assert process.attributes["messaging.message.id"] == task_id
    assert process.attributes["obsq.task.outcome"] == "success"
