"""`obsq scheduler`: enqueues the App's periodic tasks. Any number of replicas may run;
one holds the lock at a time, and each entry's last run is kept in Redis so a failover
neither skips nor repeats a run (missed runs are caught up once, not one by one)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from obsq.app import App
from obsq.client import Client
from obsq.errors import DuplicateTask
from obsq.maintenance.sweep import Sweep
from obsq.schedule import Periodic

log = logging.getLogger("obsq")
SCHEDULER_INTERVAL = 1.0


class SchedulerLoop(Sweep):
    name = "scheduler"

    def __init__(self, client: Client, entries: list[Periodic], owner: str) -> None:
        super().__init__(client.broker, owner, SCHEDULER_INTERVAL)
        self.client = client
        self.entries = entries

    async def sweep(self) -> float:
        now = time.time()
        last_runs = await self.broker.last_runs([e.id for e in self.entries])
        soonest = now + SCHEDULER_INTERVAL
        for entry in self.entries:
            last = last_runs.get(entry.id)
            if last is None:  # a new entry starts counting now
                await self.broker.set_last_run(entry.id, now)
                last = now
            due = entry.next_after(last)
            if due <= now:
                await self._enqueue(entry, due)
                last = due if entry.next_after(due) > now else now
                await self.broker.set_last_run(entry.id, last)
                due = entry.next_after(last)
            soonest = min(soonest, due)
        return max(soonest - time.time(), 0.01)

    async def _enqueue(self, entry: Periodic, due: float) -> None:
        try:
            info = await self.client.enqueue(entry.task_type, entry.payload,
                                             task_id=f"periodic-{entry.id}-{int(due)}",
                                             **entry.options)
            log.info("scheduled %s (%s) as %s", entry.task_type, entry.spec, info.id)
        except DuplicateTask:
            pass  # enqueued already by a replica that lost its lock mid-tick


class Scheduler:
    def __init__(self, app: App, redis_url: str, namespace: str | None = None) -> None:
        self.app = app
        self.client = Client(redis_url, namespace or app.namespace, app=app)
        self.loop = SchedulerLoop(self.client, app.periodic_tasks,
                                  f"scheduler-{id(self):x}-{time.time_ns()}")
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        await self.client.broker.check()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        log.info("scheduler started with %d periodic task(s)", len(self.app.periodic_tasks))
        self.loop.start()
        await self._stopped.wait()
        await self.loop.stop()
        await self.client.close()
        log.info("scheduler stopped")

    def stop(self) -> None:
        self._stopped.set()
