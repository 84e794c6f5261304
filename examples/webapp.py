"""A FastAPI app that enqueues tasks: the trace of a request runs from its HTTP server
span through `send {queue}` to the worker's `process {queue}`.

    pip install 'obsq[otlp]' fastapi uvicorn opentelemetry-instrumentation-fastapi
    uvicorn examples.webapp:app --port 8000
    curl -X POST 'localhost:8000/reports/monthly?month=2026-11'
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

import obsq
from examples.tasks import app as tasks
from obsq.observability import instrument_app, setup_tracing, shutdown_tracing

REDIS_URL = os.environ.get("OBSQ_REDIS_URL", "redis://localhost:6379/0")

# Send spans carrying the request's trace into each task, and obsq_tasks_enqueued_total,
# for every Client built with the tasks' App.
instrument_app(tasks)
# One client for the whole process: it holds a connection pool. Created at import, it
# connects on first use, inside the server's event loop.
client = obsq.Client(REDIS_URL, namespace=tasks.namespace, app=tasks)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    setup_tracing(service_name="obsq-example-web")  # only when OTEL_* variables ask
    yield
    await client.close()
    shutdown_tracing()


app = FastAPI(title="obsq example", lifespan=lifespan)


@app.post("/reports/{kind}", status_code=202)
async def order_report(kind: str, month: str) -> dict[str, str]:
    info = await client.enqueue(f"report:{kind}", {"month": month}, retention=3600)
    return {"task_id": info.id, "state": info.state}


@app.get("/tasks/{task_id}")
async def task_state(task_id: str) -> dict[str, object]:
    try:
        info = await client.info(task_id)
    except obsq.TaskNotFound:
        raise HTTPException(404, "no such task") from None
    return {"task_id": info.id, "state": info.state, "result": info.result,
            "error": info.error}


FastAPIInstrumentor.instrument_app(app)
