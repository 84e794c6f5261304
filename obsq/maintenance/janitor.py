"""Deletes completed tasks whose retention has ended and dead tasks past their age or
count limit, so Redis memory stays bounded."""

from __future__ import annotations

from obsq.broker import Broker
from obsq.maintenance.sweep import Sweep
from obsq.settings import DEAD_MAX_AGE, DEAD_MAX_COUNT, JANITOR_INTERVAL, SWEEP_BATCH


class Janitor(Sweep):
    name = "janitor"

    def __init__(self, broker: Broker, owner: str, *, dead_max_age: float = DEAD_MAX_AGE,
                 dead_max_count: int = DEAD_MAX_COUNT,
                 interval: float = JANITOR_INTERVAL) -> None:
        super().__init__(broker, owner, interval)
        self.dead_max_age = dead_max_age
        self.dead_max_count = dead_max_count

    async def sweep(self) -> None:
        for queue in await self.broker.queues():
            deleted = SWEEP_BATCH
            while deleted >= SWEEP_BATCH:
                deleted = await self.broker.cleanup(queue, self.dead_max_age,
                                                    self.dead_max_count, SWEEP_BATCH)
