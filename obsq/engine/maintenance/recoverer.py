"""Takes tasks back from workers that can no longer finish them: at once from a worker
whose heartbeat stopped (`worker_lost`: SIGKILL, OOM kill, lost node), and from any
attempt whose lease ran out (`expired`: a wedged worker, or the fallback)."""

from __future__ import annotations

import logging

from obsq.app import Hooks
from obsq.broker import Broker
from obsq.loop import LockedLoop
from obsq.settings import SWEEP_BATCH

log = logging.getLogger("obsq")


class Recoverer(LockedLoop):
    name = "recoverer"

    def __init__(self, broker: Broker, owner: str, interval: float, lock_ttl: float, *,
                 max_recoveries: int, hooks: Hooks[[str, str, int]]) -> None:
        super().__init__(broker, owner, interval, lock_ttl)
        self.max_recoveries = max_recoveries
        self.hooks = hooks

    async def work(self) -> float:
        """Returns how long to sleep: the interval, or less when a lease ends sooner."""
        soonest = self.interval
        lost = await self.broker.lost_workers()
        for queue in await self.broker.queues():
            cursor = "0"
            while lost:  # the attempts of lost workers, a bounded scan at a time
                requeued, killed, cursor, _ = await self.broker.recover(
                    queue, self.max_recoveries, SWEEP_BATCH, lost, cursor)
                self._report(queue, "worker_lost", requeued, killed)
                if cursor == "0":
                    break
            requeued, killed = SWEEP_BATCH, 0
            while requeued + killed >= SWEEP_BATCH:
                requeued, killed, _, ends_in = await self.broker.recover(
                    queue, self.max_recoveries, SWEEP_BATCH)
                self._report(queue, "expired", requeued, killed)
            if ends_in is not None:
                soonest = min(soonest, ends_in)
        if lost:
            await self.broker.forget_workers(lost)
            log.warning("workers stopped heartbeating, their tasks were taken back: %s",
                        ", ".join(lost))
        return soonest

    def _report(self, queue: str, reason: str, requeued: int, killed: int) -> None:
        if requeued or killed:
            log.warning("recovered %d task(s) of queue %s (%s); %d exceeded max_recoveries "
                        "and went to dead", requeued + killed, queue, reason, killed)
            self.hooks(queue, reason, requeued + killed)
