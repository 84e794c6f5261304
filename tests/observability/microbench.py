"""Cost of obsq's observability per task, measured on the middleware and hooks alone (no
Redis, no event loop), and the time of one /metrics rendering. A figure report, not a test:

    python tests/observability/microbench.py [--redis-url redis://127.0.0.1:6379/0]
    PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) python tests/observability/microbench.py

Per-task figures are the extra time over a bare middleware chain, for: metrics middleware +
outcome hook; tracing middleware + outcome hook (a sampled span, batch processor, a task
carrying a traceparent); both; and the producer hooks per message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import obsq
from obsq.observability.enqueue_metrics import EnqueueMetrics
from obsq.observability.metrics import TaskMetrics
from obsq.observability.tracing import SendTracing, TaskTracing
from obsq.task import Job, TaskInfo, build_message

N = 20_000
TRACEPARENT = b'{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'


class Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def make_task(headers: bytes = b"") -> obsq.Task:
    return obsq.Task(id="0123456789abcdef0123456789abcdef", type="email:send", queue="default",
                     raw_payload=b"{}", raw_headers=headers, retry_count=0, max_retry=25,
                     timeout=30.0, retention=0.0, wait_seconds=0.012, route="email:send")


async def handler(task):
    return None


def drive(coro) -> None:
    """Run a coroutine that never suspends, without an event loop."""
    with contextlib.suppress(StopIteration):
        coro.send(None)


def run_chain(middleware, hooks, headers: bytes) -> float:
    """Seconds per task of building a task, running the chain and calling the hooks."""
    app = obsq.App()
    for m in middleware:
        app.use(m)
    chain = app.wrap(handler)
    best = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(N):
            task = make_task(headers)
            drive(chain(task))
            for hook in hooks:
                hook(task, "success", None)
        best.append((time.perf_counter() - started) / N)
    return min(best)


def run_producer(hooks, count: int = 1) -> float:
    async def store(messages):
        return [TaskInfo(id=m.id, type=m.type, queue=m.queue, state="pending",
                         headers=m.headers) for m in messages]

    client_hooks = list(hooks)
    best = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(N // count):
            messages = [build_message(Job("email:send", {"to": "x"})) for _ in range(count)]
            call = store
            for hook in reversed(client_hooks):
                call = (lambda h, nxt: lambda ms: h(ms, nxt))(hook, call)
            drive(call(messages))
        best.append((time.perf_counter() - started) / (N // count * count))
    return min(best)


def scrape_time(redis_url: str | None, queues: int = 20, types: int = 50) -> None:
    from prometheus_client.exposition import choose_encoder

    from obsq.broker import Broker
    from obsq.observability.collector import QueueCollector
    from obsq.observability.metrics import endpoint_registry

    metrics = TaskMetrics()
    names = [f"q{i}" for i in range(queues)]
    # Realistic: each task type lives in one queue. Worst: every type seen in every queue.
    for layout, pairs in (("50 series (each type in one queue)",
                           [(names[t % queues], f"type:{t}") for t in range(types)]),
                          ("1000 series (every type in every queue)",
                           [(q, f"type:{t}") for q in names for t in range(types)])):
        for queue, route in pairs:
            task = make_task()
            task.queue, task.route = queue, route
            drive(metrics.middleware(task, handler))
            for outcome in ("success", "retry"):
                metrics.on_outcome(task, outcome, None)
                task.context["obsq.ran"] = True
        collectors = []
        loop = thread = broker = None
        if redis_url:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            broker = Broker(redis_url, "microbench")
            collectors.append(QueueCollector(broker, loop, names, cache_seconds=0))
        registry = endpoint_registry(*collectors)
        for accept, label in (("", "text"), ("application/openmetrics-text; version=1.0.0",
                                              "openmetrics")):
            encoder, _ = choose_encoder(accept)
            times = []
            for _ in range(20):
                started = time.perf_counter()
                body = encoder(registry)
                times.append(time.perf_counter() - started)
            print(f"  scrape, {layout}, {label}{' + Redis read' if redis_url else ''}: "
                  f"median {statistics.median(times) * 1000:.1f} ms, "
                  f"{len(body) // 1024} KiB")
        if broker is not None:
            asyncio.run_coroutine_threadsafe(broker.close(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="also read the queue gauges from this Redis")
    args = parser.parse_args()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=N * 2))
    trace.set_tracer_provider(provider)
    mode = "multiprocess" if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else "single-process"
    print(f"obsq observability micro-benchmark (prometheus-client {mode} mode, "
          f"Python {sys.version.split()[0]}), best of 5 x {N} tasks")

    async def bare(task, call_next):
        return await call_next(task)

    m, t = TaskMetrics(), TaskTracing()
    base = run_chain([bare, bare], [], TRACEPARENT)
    figures = {
        "metrics": run_chain([bare, m.middleware], [m.on_outcome], TRACEPARENT),
        "tracing": run_chain([t.middleware, bare], [t.on_outcome], TRACEPARENT),
        "metrics + tracing": run_chain([t.middleware, m.middleware],
                                       [m.on_outcome, t.on_outcome], TRACEPARENT),
    }
    print(f"  bare chain (2 pass-through middleware + task object): {base * 1e6:.1f} us/task")
    for name, seconds in figures.items():
        print(f"  {name:<18} +{(seconds - base) * 1e6:5.1f} us/task")
    plain = run_producer([])
    counted = EnqueueMetrics(None)
    for count in (1, 100):
        both = run_producer([SendTracing(), counted.hook], count)
        print(f"  producer hooks (send span + count), batches of {count}: "
              f"+{(both - run_producer([], count)) * 1e6:5.1f} us/message")
    del plain
    scrape_time(args.redis_url)
    provider.shutdown()


if __name__ == "__main__":
    main()
