"""The two loops that keep a worker's claims alive: its heartbeat (so the recoverer takes
its tasks back within seconds if it dies) and its leases (so a long task is not taken
from a worker that is still running it). Both run on the worker's event loop, beside the
handlers, never inside them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from obsq.broker import Attempt, Broker
from obsq.errors import BrokerError
from obsq.loop import BackgroundLoop

log = logging.getLogger("obsq")


class Heartbeat(BackgroundLoop):
    """Also renews the worker's event subscriptions (event, subscriber, queue), which lapse
    `subscription_ttl` after the last renewal of any worker serving them."""

    name = "heartbeat"

    def __init__(self, broker: Broker, worker_id: str, describe: Callable[[], dict[str, Any]],
                 interval: float, ttl: float,
                 subscriptions: Sequence[tuple[str, str, str]] = (),
                 subscription_ttl: float = 0.0) -> None:
        super().__init__(interval)
        self.broker = broker
        self.worker_id = worker_id
        self.describe = describe
        self.ttl = ttl
        self.subscriptions = list(subscriptions)
        self.subscription_ttl = subscription_ttl
        self.last_success = time.monotonic()  # of the last heartbeat Redis accepted

    async def beat(self) -> None:
        await self.broker.heartbeat(self.worker_id, self.describe(), self.ttl)
        if self.subscriptions:
            await self.broker.subscribe(self.subscriptions, self.subscription_ttl)
        self.last_success = time.monotonic()

    async def tick(self) -> None:
        await self.beat()

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(BrokerError):
            await self.broker.deregister(self.worker_id)


class LeaseKeeper(BackgroundLoop):
    name = "lease-keeper"

    def __init__(self, broker: Broker, worker_id: str, lease_seconds: float,
                 running: Callable[[], dict[str, list[Attempt]]]) -> None:
        super().__init__(lease_seconds / 3)
        self.broker = broker
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.running = running

    async def tick(self) -> None:
        attempts = self.running()
        if not attempts:
            return
        lost = await self.broker.extend(attempts, self.lease_seconds, self.worker_id)
        for queue, ids in lost.items():
            if ids:
                log.warning("lease lost for %d running task(s) of queue %s (taken over after "
                            "the lease expired): %s", len(ids), queue, ", ".join(ids[:10]))
