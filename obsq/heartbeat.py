"""The two loops that keep a worker's claims alive: its heartbeat (so the recoverer takes
its tasks back within seconds if it dies) and its leases (so a long task is not taken
from a worker that is still running it). Both run on the worker's event loop, beside the
handlers, never inside them. The heartbeat also reads Redis's maxmemory-policy now and
then: one changed at run time to a policy that evicts is warned about, not refused, since
the running tasks are better finished."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from obsq.broker import Attempt, Broker
from obsq.broker.calls import eviction_problem
from obsq.errors import BrokerError
from obsq.loop import BackgroundLoop
from obsq.settings import SAFE_MEMORY_POLICY

log = logging.getLogger("obsq")


class Heartbeat(BackgroundLoop):
    """Also renews the worker's event subscriptions (event, subscriber, queue), which lapse
    `subscription_ttl` after the last renewal of any worker serving them."""

    name = "heartbeat"

    def __init__(self, broker: Broker, worker_id: str, describe: Callable[[], dict[str, Any]],
                 interval: float, ttl: float, policy_interval: float,
                 memory_policy: str | None = None,
                 subscriptions: Sequence[tuple[str, str, str]] = (),
                 subscription_ttl: float = 0.0) -> None:
        """`memory_policy`: the one read at start (None: unknown)."""
        super().__init__(interval)
        self.broker = broker
        self.worker_id = worker_id
        self.describe = describe
        self.ttl = ttl
        self.subscriptions = list(subscriptions)
        self.subscription_ttl = subscription_ttl
        self.last_success = time.monotonic()  # of the last heartbeat Redis accepted
        self.policy_interval = policy_interval
        self.memory_policy = memory_policy
        self._policy_read_at = time.monotonic()

    async def beat(self) -> None:
        await self.broker.heartbeat(self.worker_id, self.describe(), self.ttl)
        self.last_success = time.monotonic()
        if self.subscriptions:  # a Redis at maxmemory refuses them; the heartbeat counts
            try:
                await self.broker.subscribe(self.subscriptions, self.subscription_ttl)
            except BrokerError as exc:  # counted by the broker's hooks; tried next beat
                log.warning("event subscriptions not renewed: %s", exc)

    async def tick(self) -> None:
        await self.beat()
        if time.monotonic() - self._policy_read_at >= self.policy_interval:
            self._policy_read_at = time.monotonic()
            with contextlib.suppress(BrokerError):  # counted; the next read may succeed
                self._policy_read(await self.broker.memory_policy())

    def _policy_read(self, policy: str | None) -> None:
        if policy is None or policy == self.memory_policy:
            return
        before, self.memory_policy = self.memory_policy, policy
        if policy != SAFE_MEMORY_POLICY:
            log.warning("%s (changed at run time from %s)",
                        eviction_problem(self.broker.safe_url, policy), before)
        else:
            log.info("Redis's maxmemory-policy is %s again", policy)

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
