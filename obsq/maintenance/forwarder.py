"""Moves scheduled and retry tasks to pending when they are due. It sleeps until the
earliest due task, at most FORWARD_INTERVAL, so a delay is kept to within that."""

from __future__ import annotations

import time

from obsq.broker import Broker
from obsq.maintenance.sweep import Sweep
from obsq.settings import FORWARD_INTERVAL, SWEEP_BATCH


class Forwarder(Sweep):
    name = "forwarder"

    def __init__(self, broker: Broker, owner: str, interval: float = FORWARD_INTERVAL) -> None:
        super().__init__(broker, owner, interval)

    async def sweep(self) -> float:
        """Returns how long to sleep: until the earliest due task, on Redis's clock."""
        started = time.monotonic()
        soonest = self.interval
        for queue in await self.broker.queues():
            for state in ("scheduled", "retry"):
                moved, due_in = SWEEP_BATCH, None
                while moved == SWEEP_BATCH:
                    moved, due_in = await self.broker.forward(queue, state, SWEEP_BATCH)
                if due_in is not None:
                    soonest = min(soonest, due_in)
        return max(soonest - (time.monotonic() - started), 0.001)
