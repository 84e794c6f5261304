"""Moves scheduled and retry tasks to pending when they are due. It sleeps until the
earliest due task, at most its interval, so a delay is kept to within that."""

from __future__ import annotations

from obsq.loop import LockedLoop
from obsq.settings import SWEEP_BATCH


class Forwarder(LockedLoop):
    name = "forwarder"

    async def work(self) -> float:
        """Returns how long to sleep: until the earliest due task, on Redis's clock. Every
        queue's sets are swept in one round trip (again for those with more due)."""
        started = self.clock.monotonic()
        soonest = self.interval
        sets = [(queue, state) for queue in await self.broker.queues()
                for state in ("scheduled", "retry")]
        while sets:
            swept = await self.broker.forward(sets, SWEEP_BATCH)
            for _, due_in in swept:
                if due_in is not None:
                    soonest = min(soonest, due_in)
            sets = [s for s, (moved, _) in zip(sets, swept) if moved == SWEEP_BATCH]
        return max(soonest - (self.clock.monotonic() - started), 0.001)
