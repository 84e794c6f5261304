"""`obsq exporter`: the queue-wide gauges of every queue in Redis, for those who prefer one
exporter to reading them from every worker. /healthz says the event loop answers,
/readyz that Redis answered the last ping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any

from obsq import __version__
from obsq.broker import Broker
from obsq.errors import BrokerError
from obsq.observability.collector import QueueCollector
from obsq.observability.http import HealthServer, loop_answers
from obsq.observability.metrics import endpoint_registry

log = logging.getLogger("obsq")
PING_INTERVAL = 2.0


class RedisWatch:
    """Pings Redis every PING_INTERVAL; `problem()` is what /readyz reports."""

    def __init__(self, broker: Broker, interval: float = PING_INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self.ok = True
        self.last_ok = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.broker.queues(), timeout=self.interval)
                if not self.ok:
                    log.info("Redis reachable again")
                self.ok, self.last_ok = True, time.monotonic()
            except (BrokerError, asyncio.TimeoutError) as exc:
                if self.ok:
                    log.warning("Redis unreachable: %s", exc or "timeout")
                self.ok = False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)

    def problem(self) -> str | None:
        return None if self.ok else "Redis is unreachable"


async def run_exporter(redis_url: str, namespace: str, port: int, *, host: str | None = None,
                       ready: Any = None) -> None:
    """Serve until SIGTERM/SIGINT. `ready(server)` is called once it listens."""
    broker = Broker(redis_url, namespace)
    await broker.check()
    loop = asyncio.get_running_loop()
    watch = RedisWatch(broker)
    registry = endpoint_registry(QueueCollector(broker, loop, broker.queues),
                                 include_process=False)
    started = time.time()

    def live() -> str | None:
        return None if loop_answers(loop) else "the event loop did not answer"

    def status() -> dict[str, Any]:
        return {"exporter": True, "version": __version__, "namespace": namespace,
                "redis_ok": watch.ok, "uptime": round(time.time() - started, 3)}

    server = HealthServer(host or os.environ.get("OBSQ_HTTP_HOST", "0.0.0.0"), port, registry,
                          live=live, ready=watch.problem, status=status)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    log.info("exporter serving the queue gauges of namespace %s on :%d", namespace,
             server.port)
    if ready is not None:
        ready(server)
    try:
        await watch.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        await asyncio.to_thread(server.close)
        await broker.close()
        log.info("exporter stopped")
