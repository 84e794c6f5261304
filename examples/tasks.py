"""Task handlers, the file you copy to start: an App, a few handlers and a middleware.

Run a worker for it from the repository root:

    obsq worker examples.tasks:app --queues default=3,reports=1

Every handler gets a `process {queue}` span, metrics labelled with its route, and log
lines that carry the trace id, without a line of observability code here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import obsq

# Producers and workers must agree on the namespace (the Redis key prefix).
app = obsq.App(namespace=os.environ.get("OBSQ_NAMESPACE", "obsq"))
log = logging.getLogger("examples.tasks")


@app.task("email:send", queue="default", max_retry=5, timeout=30)
async def send_email(task: obsq.Task) -> dict[str, str]:
    """An async handler: it runs on the worker's event loop, so it must not block it."""
    await asyncio.sleep(0.05)  # the mail server's round trip
    log.info("mail sent (task %s)", task.id)
    return {"sent_to": task.payload["to"]}


@app.task("report:", queue="reports", timeout=300)  # a prefix: report:daily, report:monthly
def build_report(task: obsq.Task) -> dict[str, object]:
    """A plain function: obsq runs it in a thread pool, so blocking calls are fine."""
    kind = task.type.partition(":")[2]
    time.sleep(0.1)  # the database query
    return {"report": kind, "month": task.payload["month"], "rows": 42}


def charge_backoff(retries: int, exc: BaseException, task: obsq.Task) -> float:
    return 2.0 ** retries  # 1 s, 2 s, 4 s


@app.task("payment:charge", queue="default", max_retry=3, retry_delay=charge_backoff)
async def charge(task: obsq.Task) -> dict[str, int]:
    if task.payload.get("card") == "declined":
        raise obsq.SkipRetry("card declined")  # retrying cannot help: straight to dead
    return {"charged": task.payload["amount"]}


@app.use
async def log_slow_tasks(task: obsq.Task, call_next):
    """Middleware wraps every handler (first added is outermost, after obsq's own)."""
    started = time.perf_counter()
    try:
        return await call_next(task)
    finally:
        elapsed = time.perf_counter() - started
        if elapsed > 1.0:
            log.warning("%s took %.1f s", task.type, elapsed)
