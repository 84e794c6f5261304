"""`obsq demo`: a worker, a producer and the HTTP endpoint in one process, so a new user
sees tasks run, fail, retry and die, and the metrics they leave, with no setup at all.

Each run has a namespace of its own, `obsq-demo-<random>` unless given one, and removes
its keys at the end: demos sharing a Redis neither take each other's tasks nor wipe them.
A namespace given that already holds keys is refused, as the demo would delete them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import socket
import time
import urllib.request
from typing import Any

import obsq
from obsq.broker import Broker
from obsq.errors import BrokerError, ConfigurationError
from obsq.observability import run_worker
from obsq.redis_server import start_private_redis

NAMESPACE = "obsq-demo"  # the prefix of each run's own namespace
app = obsq.App(namespace=NAMESPACE)


@app.task("email:send", queue="default", retry_delay=0.5)
async def send_email(task: obsq.Task) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0.05, 0.3))
    return {"sent_to": task.payload["to"]}


@app.task("image:resize", queue="default")
def resize_image(task: obsq.Task) -> dict[str, int]:
    time.sleep(0.1)  # a blocking handler: obsq runs plain functions in a thread pool
    return {"width": task.payload["width"] // 2}


@app.task("report:", queue="critical", retry_delay=0.5)
async def build_report(task: obsq.Task) -> str:
    if task.retry_count < 2:
        raise ConnectionError("the report database is busy")  # retried, then succeeds
    await task.update_state({"step": "rendering"})
    return f"{task.type} ready"


@app.task("payment:charge", queue="critical", max_retry=2, retry_delay=0.5)
async def charge(task: obsq.Task) -> None:
    raise ValueError("card declined")  # fails every time: two retries, then dead


async def run_demo(redis_url: str | None, duration: float, http_port: int,
                   namespace: str | None = None) -> int:
    logging.basicConfig(level=logging.ERROR)  # the demo prints each outcome itself
    namespace = namespace or f"{NAMESPACE}-{secrets.token_hex(3)}"
    server = None
    if redis_url is None:
        redis_url = "redis://127.0.0.1:6379/0"
        if await _reachable(redis_url):
            print(f"Using the Redis at {redis_url} (namespace {namespace!r}).")
        else:
            server = await asyncio.to_thread(start_private_redis)
            if server is None:
                print("No Redis is reachable and none could be started: install redis-server "
                      "(apt-get install redis-server, brew install redis), or give one with "
                      "--redis-url.")
                return 1
            redis_url = server.url
            print(f"No Redis on 127.0.0.1:6379, so the demo started a private redis-server "
                  f"{await _version(redis_url)} ({server.executable}) at {redis_url}.")
    elif not await _reachable(redis_url):
        print(f"Cannot reach Redis at {redis_url}.")
        return 1
    else:
        print(f"Using the Redis at {redis_url} (namespace {namespace!r}).")
    if server is None and await _holds_keys(redis_url, namespace):
        print(f"Namespace {namespace!r} already holds keys at {redis_url}, and the demo "
              "removes its namespace's keys at the end: give it an unused one.")
        return 1
    try:
        return await _demo(redis_url, namespace, duration,
                           _port_or_free(http_port) if http_port else 0)
    finally:
        if server is not None:
            server.close()
        else:  # your own Redis: leave nothing of the demo behind
            await _clean_up(redis_url, namespace)


async def _demo(redis_url: str, namespace: str, duration: float, port: int) -> int:
    app.outcome_hooks.append(_print_outcome)
    worker = obsq.Worker(app, redis_url=redis_url, queues={"critical": 6, "default": 3},
                         namespace=namespace, concurrency=10, shutdown_timeout=5,
                         handle_signals=True)
    endpoint: list[Any] = []
    running = asyncio.create_task(run_worker(worker, http_port=port, serving=endpoint.append))
    while not worker.started_at and not running.done():
        await asyncio.sleep(0.05)
    if running.done():
        running.result()  # raises the worker's start-up error
    port = endpoint[0].port
    client = obsq.Client(redis_url, namespace, app=app)
    print(f"Worker {worker.id} serving queues critical and default; metrics and probes on "
          f"http://127.0.0.1:{port}/metrics, /healthz, /readyz\n")
    jobs = [obsq.Job("email:send", {"to": f"user{i}@example.com"}) for i in range(8)]
    jobs += [obsq.Job("image:resize", {"width": 800 + i}) for i in range(3)]
    jobs += [obsq.Job("report:monthly", {"month": "2026-11"}, retention=300),
             obsq.Job("payment:charge", {"amount": 42}),
             obsq.Job("email:send", {"to": "later@example.com"}, delay=2)]
    for job in jobs:
        info = (await client.enqueue_many([job]))[0]
        print(f"  enqueued {info.type:<15} {info.id[:8]} queue={info.queue} "
              f"state={info.state}")
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline and not running.done():
        await asyncio.sleep(0.2)
    print("\nA sample of /metrics:")
    print(await asyncio.to_thread(_metrics_sample, port))
    worker.stop()
    await running
    await client.close()
    print("\nNext: run your own worker with `obsq worker yourmodule:app` (see README).")
    return 0


async def _clean_up(redis_url: str, namespace: str) -> None:
    broker = Broker(redis_url, namespace)
    try:
        removed = await broker.delete_namespace()
        print(f"Removed the demo's {removed} key(s) (namespace {namespace!r}) from {redis_url}.")
    except BrokerError as exc:
        print(f"Could not remove the demo's keys (namespace {namespace!r}): {exc}")
    finally:
        await broker.close()


async def _version(redis_url: str) -> str:
    broker = Broker(redis_url, NAMESPACE)
    try:
        return str((await broker.redis.info("server"))["redis_version"])
    finally:
        await broker.close()


async def _holds_keys(redis_url: str, namespace: str) -> bool:
    broker = Broker(redis_url, namespace)
    try:
        async for _ in broker.redis.scan_iter(match=f"{namespace}:*", count=1000):
            return True
        return False
    finally:
        await broker.close()


def _print_outcome(task: obsq.Task, outcome: str, error: BaseException | None) -> None:
    detail = f" ({type(error).__name__}: {error})" if error else ""
    print(f"  {outcome:<8} {task.type:<15} {task.id[:8]} try {task.retry_count + 1}{detail}")


def _metrics_sample(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    wanted = ("obsq_tasks_processed_total{", "obsq_queue_depth{", "obsq_workers ")
    return "\n".join("  " + line for line in text.splitlines() if line.startswith(wanted))


async def _reachable(url: str) -> bool:
    broker = Broker(url, NAMESPACE)
    try:
        await broker.check()
        return True
    except (ConfigurationError, BrokerError):
        return False
    finally:
        await broker.close()


def _port_or_free(port: int) -> int:
    with socket.socket() as s:
        with contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

