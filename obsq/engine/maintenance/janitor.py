"""Deletes completed tasks whose retention has ended and dead tasks past their age or
count limit, so Redis memory stays bounded."""

from __future__ import annotations

from obsq.broker import Broker
from obsq.loop import LockedLoop
from obsq.settings import SWEEP_BATCH


class Janitor(LockedLoop):
    name = "janitor"

    def __init__(self, broker: Broker, owner: str, interval: float, lock_ttl: float, *,
                 dead_max_age: float, dead_max_count: int) -> None:
        super().__init__(broker, owner, interval, lock_ttl)
        self.dead_max_age = dead_max_age
        self.dead_max_count = dead_max_count

    async def work(self) -> None:
        for queue in await self.broker.queues():
            deleted = SWEEP_BATCH
            while deleted >= SWEEP_BATCH:
                deleted = await self.broker.cleanup(queue, self.dead_max_age,
                                                    self.dead_max_count, SWEEP_BATCH)
