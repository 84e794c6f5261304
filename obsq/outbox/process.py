"""`obsq outbox`: a relay as a process of its own, with its metrics and probes, until
SIGTERM/SIGINT; and a relay run beside a worker (`obsq worker --outbox-database-url`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from prometheus_client import REGISTRY

from obsq._version import __version__
from obsq.background import on_stop_signals
from obsq.observability.http import HealthServer
from obsq.observability.metrics import endpoint_registry
from obsq.observability.probes import loop_liveness
from obsq.outbox.metrics import watch_relay
from obsq.outbox.relay import Relay
from obsq.producer.client import Client

log = logging.getLogger("obsq.outbox")


async def run_relay(relay: Relay, *, http_port: int | None = None,
                    http_host: str = "0.0.0.0") -> None:
    """Run `relay` until SIGTERM/SIGINT, with /metrics, /healthz (the event loop answers)
    and /readyz (the last batch did not fail) on `http_port` (None or negative: none)."""
    loop = asyncio.get_running_loop()
    remove_signals = on_stop_signals(lambda sig: relay.stop())
    collector = watch_relay(relay)
    started = time.time()

    def status() -> dict[str, Any]:
        return {"outbox": relay.table.name, "version": __version__,
                "namespace": relay.client.namespace, "relayed": relay.relayed,
                "rows_waiting": relay.backlog.rows,
                "oldest_age": round(relay.backlog.age(), 3),
                "uptime": round(time.time() - started, 3)}

    server = None
    try:
        if http_port is not None and http_port >= 0:
            server = HealthServer(http_host, http_port, endpoint_registry(),
                                  live=loop_liveness(loop), ready=relay.problem, status=status)
            log.info("outbox relay of %s: metrics and probes on :%d", relay.table.name,
                     server.port)
        log.info("outbox relay of %s started: moving committed rows to namespace %s",
                 relay.table.name, relay.client.namespace)
        await relay.run()
    finally:
        remove_signals()
        REGISTRY.unregister(collector)
        if server is not None:
            await asyncio.to_thread(server.close)
        await relay.client.close()
        relay.engine.dispose()
        log.info("outbox relay of %s stopped after moving %d rows", relay.table.name,
                 relay.relayed)


async def beside(work: Awaitable[None], relay: Relay) -> None:
    """Run `work` (a worker) with `relay` beside it, its metrics on the worker's endpoint;
    the relay stops when the work ends."""
    collector = watch_relay(relay)
    moving = asyncio.ensure_future(relay.run())
    try:
        await work
    finally:
        relay.stop()
        await asyncio.gather(moving, return_exceptions=True)
        REGISTRY.unregister(collector)
        await relay.client.close()
        relay.engine.dispose()


def relay_of(database_url: str, redis_url: str, namespace: str, **options: Any) -> Relay:
    """A relay from the command line's settings (options: Relay's)."""
    return Relay(database_url, Client(redis_url, namespace), **options)
