"""`obsq scheduler`: enqueues the App's periodic tasks. Any number of replicas may run;
one holds the lock at a time, and each entry's last run is kept in Redis so a failover
neither skips nor repeats a run (missed runs are caught up once, not one by one).

Like the Worker it knows nothing of metrics or HTTP: obsq.observability.run_scheduler
serves its probes and metrics, asking it through `health()` and `describe()`."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from obsq._version import __version__
from obsq.app import App
from obsq.client import Client
from obsq.errors import DuplicateTask
from obsq.loop import LockedLoop, on_stop_signals
from obsq.schedule import Periodic
from obsq.settings import SCHEDULER_INTERVAL, SCHEDULER_LOCK_TTL

log = logging.getLogger("obsq")


class SchedulerLoop(LockedLoop):
    name = "scheduler"

    def __init__(self, client: Client, entries: list[Periodic], owner: str) -> None:
        super().__init__(client.broker, owner, SCHEDULER_INTERVAL, SCHEDULER_LOCK_TTL)
        self.client = client
        self.entries = entries

    async def work(self) -> float:
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
        self.started_at = 0.0
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        """Enqueue due entries until stop() or SIGTERM/SIGINT."""
        remove_signals = on_stop_signals(lambda sig: self.stop())  # first: none is missed
        try:
            await self.client.broker.check()
            log.info("scheduler started with %d periodic task(s)",
                     len(self.app.periodic_tasks))
            self.started_at = time.time()
            self.loop.start()
            await self._stopped.wait()
        finally:
            remove_signals()
            await self.loop.stop()
            await self.client.close()
            log.info("scheduler stopped")

    def stop(self) -> None:
        self._stopped.set()

    def ready(self) -> str | None:
        """None when it serves (started, and its last look at Redis succeeded), else why
        not: what readiness reports."""
        if not self.started_at:
            return "the scheduler is starting"
        return None if self.loop.failures == 0 else "Redis is unreachable"

    def describe(self) -> dict[str, Any]:
        return {"scheduler": self.loop.owner, "version": __version__,
                "namespace": self.client.namespace,
                "periodic_tasks": len(self.app.periodic_tasks),
                "redis_ok": self.loop.failures == 0,
                "uptime": round(time.time() - self.started_at, 3) if self.started_at else 0.0}
