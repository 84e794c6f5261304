"""Maintenance sweeps that keep the queues healthy whichever workers come and go: the
forwarder (due scheduled and retried tasks -> pending), the recoverer (tasks of lost workers
and expired leases -> pending) and the janitor (retention, and what was set aside as junk).
Every worker runs them; a short lock per sweep lets one process at a time do the work. A
record a sweep cannot read (a task's key holding no hash) costs only itself: its script sets
it aside in the queue's junk and names it, and the broker says so once (`said_aside`)."""

from __future__ import annotations

import logging

from obsq.app import Hooks
from obsq.background import LockedLoop
from obsq.broker import Broker
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
        await self._forget_flows_set_aside()

    async def _forget_flows_set_aside(self) -> None:
        """The flows set aside as long ago as the dead tasks deleted go, with their keys (a
        queue's junk goes in cleanup)."""
        until = (self.clock.time() - self.dead_max_age) * 1000
        cursor = "0"
        while True:
            cursor, found = await self.broker.flows_set_aside(cursor, SWEEP_BATCH)
            for flow_id, at, _ in found:
                if at >= until:
                    continue
                try:
                    await self.broker.delete_flow(flow_id.decode())
                except UnicodeDecodeError:  # no flow's id: no keys of its own
                    await self.broker.index_flows("remove", flow_id)
            if cursor == "0":
                return


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
