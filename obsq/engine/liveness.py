"""What keeps a worker alive and tells how it is, whatever its handlers do: the heartbeat
thread (heartbeat and leases, obsq/engine/heartbeat.py), the event-loop monitor and its watchdog
(obsq/engine/loop_watch.py), the check a task gets before it starts when the worker's claims were
in doubt, and the WorkerHealth its probes judge by (obsq/engine/health.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from obsq.broker import Attempt, Broker
from obsq.broker.keeping import BlockingKeeping
from obsq.engine.health import WorkerHealth
from obsq.engine.heartbeat import Claims, Keeper
from obsq.engine.loop_watch import LoopMonitor, LoopWatchdog
from obsq.hooks import Hooks
from obsq.settings import WorkerSettings
from obsq.task import Task

log = logging.getLogger("obsq")


class Vigil:
    """Started on the worker's event loop once Redis answered; stopped last."""

    def __init__(self, broker: Broker, worker_id: str, settings: WorkerSettings,
                 claims: Claims, *, describe: Callable[[], dict[str, Any]],
                 running: Callable[[asyncio.Task[Any]], Task | None],
                 memory_policy: str | None, subscriptions: Sequence[tuple[str, str, str]],
                 lag_hooks: Hooks[[float]], data_lost_hooks: Hooks[[]]) -> None:
        """`running(asyncio task)`: the obsq Task it runs, if any."""
        s = self.settings = settings
        self.broker = broker
        self.worker_id = worker_id
        self.running = running
        self.monitor = LoopMonitor(asyncio.get_running_loop())
        self.keeper = Keeper(
            # a call Redis leaves unanswered fails after the TTL, so a stop never hangs on it
            BlockingKeeping(broker, call_timeout=s.heartbeat_ttl), worker_id, describe, claims,
            interval=s.heartbeat_interval, ttl=s.heartbeat_ttl, lease_seconds=s.lease_seconds,
            policy_interval=s.policy_check_interval, memory_policy=memory_policy,
            subscriptions=subscriptions, subscription_ttl=s.subscription_ttl,
            data_lost_hooks=data_lost_hooks)
        self.watchdog = LoopWatchdog(self.monitor, s.blocked_loop_warning,
                                     self._handler_on_loop, lag_hooks)

    async def start(self) -> None:
        """Beat once (registering the subscriptions before the worker serves; a Redis that
        refuses raises BrokerError), then start the threads and the monitor."""
        await asyncio.to_thread(self.keeper.begin)
        self.keeper.start()
        self.monitor.start()
        self.watchdog.start()

    async def stop(self) -> None:
        """Stop the threads and deregister the worker."""
        self.monitor.stop()
        await asyncio.to_thread(self.watchdog.stop)
        await asyncio.to_thread(self.keeper.stop)

    def health(self, **worker: Any) -> WorkerHealth:
        """Safe to call from any thread (the HTTP endpoint's); `worker`: the fields the
        worker itself knows (started, draining, stuck slots)."""
        s, keeper = self.settings, self.keeper
        silent = time.monotonic() - keeper.last_success
        return WorkerHealth(
            heartbeat_age=silent, redis_ok=keeper.retry.failures == 0,
            redis_answers=silent < 2 * s.heartbeat_interval, loop_lag=self.monitor.lag(),
            loop_limit=s.blocked_loop_limit, heartbeat_stalled=keeper.stalled_for(),
            slots=s.concurrency, stuck_limit=s.stuck_limit, **worker)

    def in_doubt(self, task: Task) -> bool:
        """Whether the worker's claims were in doubt since the task was fetched (a silence
        long enough for them to be taken over, such as a SIGSTOP): then still_ours asks."""
        return self.keeper.doubts(task.context.get("asked_at", 0.0))

    async def still_ours(self, task: Task) -> bool:
        """Whether to run a task: yes, unless its worker's claims were in doubt since it was
        fetched and Redis says another attempt holds it now. Then it is dropped, not run
        twice."""
        if not self.in_doubt(task):
            return True
        held = await self.broker.still_held(task.kept_in, [Attempt(task.id, task.fence)],
                                            self.worker_id)
        if not held[0]:
            log.warning("task %s (%s) not started: it was taken over while this worker did "
                        "not heartbeat, and runs elsewhere", task.id, task.type)
        return held[0]

    def _handler_on_loop(self) -> str | None:
        """The handler running on the event loop now, said as its task (any thread)."""
        current = asyncio.current_task(self.monitor.loop)
        task = self.running(current) if current is not None else None
        return None if task is None else f"task {task.id} ({task.type}) of queue {task.queue}"
