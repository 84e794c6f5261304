"""The base of the sweeps that one process at a time may run: take the lock, then sweep."""

from __future__ import annotations

import contextlib

from obsq.broker import Broker
from obsq.errors import BrokerError
from obsq.loop import BackgroundLoop
from obsq.settings import LOCK_TTL


class Sweep(BackgroundLoop):
    def __init__(self, broker: Broker, owner: str, interval: float) -> None:
        super().__init__(interval)
        self.broker = broker
        self.owner = owner

    async def tick(self) -> float | None:
        if not await self.broker.try_lock(self.name, self.owner, LOCK_TTL):
            return LOCK_TTL / 2  # another process sweeps; look again before its lock lapses
        return await self.sweep()

    async def sweep(self) -> float | None:
        raise NotImplementedError

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(BrokerError):
            await self.broker.release_lock(self.name, self.owner)
