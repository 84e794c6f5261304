"""Enqueue a few tasks and wait for a result. From the repository root, with a worker
running (`obsq worker examples.tasks:app --queues default=3,reports=1`):

    python -m examples.producer

OBSQ_REDIS_URL and OBSQ_NAMESPACE say where; with OTEL_EXPORTER_OTLP_ENDPOINT set, the
`send` spans are exported and the worker's `process` spans join their traces.
"""

from __future__ import annotations

import asyncio
import os

import obsq
from examples.tasks import app
from obsq.observability import instrument_app, setup_tracing, shutdown_tracing

REDIS_URL = os.environ.get("OBSQ_REDIS_URL", "redis://localhost:6379/0")


async def main() -> dict[str, object]:
    # The App gives each task type its queue, retries and timeout (and the namespace);
    # instrumented, its clients add the trace context to each task's headers and count
    # obsq_tasks_enqueued_total.
    instrument_app(app)
    async with obsq.Client(REDIS_URL, app=app) as client:
        emails = await client.enqueue_many(
            [obsq.Job("email:send", {"to": f"user{i}@example.com"}) for i in range(3)])
        print(f"enqueued {len(emails)} emails: {', '.join(e.id[:8] for e in emails)}")
        report = await client.enqueue("report:monthly", {"month": "2026-11"}, retention=3600)
        print(f"enqueued report {report.id[:8]} on queue {report.queue}; waiting for it")
        result = await client.result(report, timeout=30)
        print(f"report ready: {result}")
        return result


if __name__ == "__main__":
    setup_tracing(service_name="obsq-example-producer")  # only when OTEL_* variables ask
    try:
        asyncio.run(main())
    finally:
        shutdown_tracing()
