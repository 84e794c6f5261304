"""`obsq scheduler`: enqueues the App's periodic tasks. Any number of replicas may run;
one holds the lock at a time, and each entry's last run is kept in Redis so a failover
neither skips nor repeats a run (missed runs are caught up once, not one by one).

With an HTTP port it serves the same endpoint as the exporter (obsq/observability/http.py):
/healthz while its event loop answers, /readyz while Redis answers, /metrics with this
process's metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

from obsq import __version__
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
    def __init__(self, app: App, redis_url: str, namespace: str | None = None, *,
                 http_port: int | None = None, http_host: str | None = None) -> None:
        """`http_port`: None or negative for no HTTP endpoint, 0 for a free port."""
        self.app = app
        self.client = Client(redis_url, namespace or app.namespace, app=app)
        self.loop = SchedulerLoop(self.client, app.periodic_tasks,
                                  f"scheduler-{id(self):x}-{time.time_ns()}")
        self._stopped = asyncio.Event()
        self._http_port = http_port if http_port is not None and http_port >= 0 else None
        self._http_host = http_host or os.environ.get("OBSQ_HTTP_HOST", "0.0.0.0")
        self.http: Any = None  # the HealthServer while running with an HTTP port

    async def run(self) -> None:
        await self.client.broker.check()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        watching = self._serve_http(loop) if self._http_port is not None else None
        log.info("scheduler started with %d periodic task(s)%s", len(self.app.periodic_tasks),
                 f", http on :{self.http.port}" if self.http else "")
        self.loop.start()
        await self._stopped.wait()
        await self.loop.stop()
        if watching is not None:
            await watching
            await asyncio.to_thread(self.http.close)
            self.http = None
        await self.client.close()
        log.info("scheduler stopped")

    def _serve_http(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
        """Start the probe endpoint; returns the Redis watch, which ends with the scheduler."""
        from obsq.observability.exporter import RedisWatch
        from obsq.observability.http import LOOP_TIMEOUT, HealthServer, loop_answers
        from obsq.observability.metrics import endpoint_registry

        watch = RedisWatch(self.client.broker)
        started = time.time()

        def live() -> str | None:
            if loop_answers(loop):
                return None
            return f"the event loop did not answer within {LOOP_TIMEOUT:g} s"

        def status() -> dict[str, Any]:
            return {"scheduler": self.loop.owner, "version": __version__,
                    "namespace": self.client.broker.namespace,
                    "periodic_tasks": len(self.app.periodic_tasks), "redis_ok": watch.ok,
                    "uptime": round(time.time() - started, 3)}

        assert self._http_port is not None
        self.http = HealthServer(self._http_host, self._http_port, endpoint_registry(),
                                 live=live, ready=watch.problem, status=status)
        return asyncio.create_task(watch.run(self._stopped), name="obsq-scheduler-redis-watch")

    def stop(self) -> None:
        self._stopped.set()
