"""A worker's part in moving flows on: before a step's handler runs, it reads the results
the step waits for (`task.previous`); after a step ends, it records the end in its flow and
launches what follows (obsq/producer/flow_steps.py), at once when this worker ended it and every
FLOW_SWEEP_INTERVAL for the ends of every queue (those of a killed worker, of a step
cancelled or deleted by an operator), in the one worker holding the sweep's lock. The sweep
also launches the first steps of flows whose producer died before it enqueued them, and
forgets the index entries of flows gone after their end; a flow it cannot move on costs
only itself (obsq/producer/flow_steps.py sets it aside)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from obsq.app import Hooks
from obsq.background import BackgroundLoop
from obsq.broker import Broker
from obsq.engine.execution import Verdict
from obsq.errors import BrokerError, UnreadableRecord
from obsq.flow import FLOW_BATCH, FLOW_SWEEP_INTERVAL, previous_value, step_of
from obsq.producer.flow_steps import record_ends, relaunch, set_aside
from obsq.task import Task

log = logging.getLogger("obsq")
RUNNING_LOOK = 60.0  # seconds until the sweep looks at a running flow again
ENDED_LOOK = 600.0  # ... at an ended one (its keys expire with its retention)


class FlowLoop(BackgroundLoop):
    name = "flows"

    def __init__(self, broker: Broker, queues: list[str], hooks: Hooks[[str]], owner: str,
                 lock_ttl: float, interval: float = FLOW_SWEEP_INTERVAL) -> None:
        """`hooks`: the App's flow hooks, told of each flow this loop ends. The sweep of
        every queue and of the index runs in one process at a time, under the lock `flows`
        (`owner`, `lock_ttl`), so that it costs Redis the same whatever the workers."""
        super().__init__(interval)
        self.broker = broker
        self.queues = queues
        self.hooks = hooks
        self.owner = owner
        self.lock_ttl = lock_ttl
        self._wake = asyncio.Event()
        self._next_sweep = 0.0
        self.recording = False  # a step of this worker ended, and its flow has not heard yet

    async def run_step(self, task: Task, run: Callable[[Task], Awaitable[Verdict]]) -> Verdict:
        """Run the attempt of a flow's step with task.previous set (read from its flow; a
        Redis that fails the read fails the attempt, retried as any)."""
        step = step_of(task)
        if step is None:  # a header that names no step: the task runs as any other
            return await run(task)
        try:
            many, waits_for, raw = await self.broker.flow_previous(*step)
        except BrokerError as exc:
            return Verdict("retry", error=exc, delay=1.0)
        task.previous = previous_value(step[0], waits_for, many, raw)
        return await run(task)

    def ended(self, task: Task) -> None:
        """A flow's step of this worker ended: record it now."""
        if step_of(task) is not None:
            self.recording = True
            self._wake.set()

    async def tick(self) -> float | None:
        self._wake.clear()
        sweep = time.monotonic() >= self._next_sweep and await self.broker.try_lock(
            self.name, self.owner, self.lock_ttl)
        queues = await self.broker.queues() if sweep else self.queues
        for queue in queues:
            await self.record(queue)
        if sweep:
            await self.sweep()
        if time.monotonic() >= self._next_sweep:  # swept, or another process holds the lock
            self._next_sweep = time.monotonic() + self.interval
        self.recording = self._wake.is_set()  # another ended meanwhile: the next round
        return None

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(BrokerError):
            await self.broker.release_lock(self.name, self.owner)

    async def record(self, queue: str) -> None:
        """Record the ends in the queue's flow inbox, oldest first, then drop them."""
        while True:
            entries = await self.broker.flow_ends(queue, FLOW_BATCH)
            for ended in await record_ends(self.broker, entries):
                self.hooks(ended)
            if entries:
                await self.broker.drop_flow_ends(queue, entries)
            if len(entries) < FLOW_BATCH:
                return

    async def sweep(self) -> None:
        """The flows due a look: launch what they left launching, look again later. A flow
        that cannot be moved on, and an index entry that is no flow id, are set aside."""
        now = self.broker.clock.time()
        for raw in await self.broker.index_flows("due", int(now * 1000), FLOW_BATCH):
            try:
                flow_id = raw.decode()
            except UnicodeDecodeError:
                await set_aside(self.broker, raw, "not a flow id (its bytes are no text)")
                continue
            try:
                state = await relaunch(self.broker, flow_id)
            except UnreadableRecord as exc:
                await set_aside(self.broker, flow_id, exc)
                continue
            if not state:
                await self.broker.index_flows("remove", flow_id)
            else:
                look = RUNNING_LOOK if state == "running" else ENDED_LOOK
                await self.broker.index_flows("set", int((now + look) * 1000), flow_id)

    async def sleep(self, seconds: float) -> None:
        """Until the interval passes, a step of this worker ends, or the loop stops."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        woken = asyncio.ensure_future(self._wake.wait())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait({stopping, woken}, timeout=max(seconds, 0),
                               return_when=asyncio.FIRST_COMPLETED)
        for waiter in (stopping, woken):
            waiter.cancel()
