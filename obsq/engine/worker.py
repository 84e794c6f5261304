"""The worker: run fetched tasks in concurrency slots, settle them, keep its claims alive,
and shut down without losing any.

Fetching is obsq/engine/fetching.py's; the worker owns the slots and the prefetch buffer the
fetcher fills, the background loops (heartbeat, leases, sweeps), and the drain: on
SIGTERM/SIGINT it releases the batches of grouped tasks it claimed, stops fetching, lets
running handlers finish within `shutdown_timeout`, hands the rest back to pending at once
and deregisters. It knows nothing of metrics, tracing or HTTP: obsq.observability wires
those on through the App's hooks, and asks the worker how it is through `health()` and
`describe()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

from obsq._version import __version__
from obsq.app import App, Hooks
from obsq.background import BackgroundLoop, on_stop_signals, reach_redis
from obsq.broker import Broker, Fetched
from obsq.broker.calls import uncancel
from obsq.clock import Clock
from obsq.engine.aggregation import AggregationLoop
from obsq.engine.cancelling import CancelWatcher
from obsq.engine.eventloop import described
from obsq.engine.execution import Executor, Verdict
from obsq.engine.fetching import BUFFER_HOLD, Fetcher, RouteLimits, ServedQueues, Slots
from obsq.engine.flows import FlowLoop
from obsq.engine.liveness import Claims, FetchProgress, Liveness, WorkerHealth
from obsq.engine.maintenance import Forwarder, Janitor, Recoverer
from obsq.engine.recycling import Recycling
from obsq.engine.settlement import Settler
from obsq.engine.throughput import ThroughputCounter
from obsq.errors import BrokerError, TaskExpired
from obsq.names import queue_of, warn_if_not_the_apps
from obsq.settings import FETCH_STOP_TIMEOUT, WorkerSettings
from obsq.task import Task

log = logging.getLogger("obsq")
__all__ = ["Worker", "WorkerHealth"]


class Worker:
    def __init__(self, app: App, redis_url: str | None = None, *,
                 queues: dict[str, int] | str | None = None, concurrency: int | None = None,
                 strict_priority: bool | None = None, shutdown_timeout: float | None = None,
                 lease_seconds: float | None = None, namespace: str | None = None,
                 max_recoveries: int | None = None, settings: WorkerSettings | None = None,
                 handle_signals: bool = True, clock: Clock | None = None,
                 **tunables: Any) -> None:
        """Options left as None come from `settings`, else from OBSQ_* variables; the other
        fields of WorkerSettings (heartbeat_ttl, ...) may be given as keywords too.
        `clock`: the time its scripts and sweeps count by (None: Redis's)."""
        given = {"redis_url": redis_url, "queues": queues, "concurrency": concurrency,
                 "strict_priority": strict_priority, "shutdown_timeout": shutdown_timeout,
                 "lease_seconds": lease_seconds, "namespace": namespace,
                 "max_recoveries": max_recoveries, **tunables}
        if settings is None:
            settings = WorkerSettings.from_env(**given)
        else:
            for name, value in given.items():
                if value is not None:
                    setattr(settings, name, value)
            settings.__post_init__()
        self.settings = settings
        self.app = app
        self.namespace = settings.namespace or app.namespace
        self.queues = settings.queues or dict.fromkeys(app.queues, 1)
        # the event subscribers of the App whose queue it serves: it registers them in Redis
        self.subscriptions = [s for s in app.subscriptions.values() if s.queue in self.queues]
        self.concurrency = settings.concurrency
        self.handle_signals = handle_signals
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started_at = 0.0
        self.started = asyncio.Event()  # set once it serves (after Redis answered)
        self.processed = 0
        self.broker = Broker(settings.redis_url, self.namespace, clock=clock,
                             on_error=app.redis_error_hooks,  # the App's: later hooks count
                             dedup_window=settings.dedup_window,
                             dedup_max_ids=settings.dedup_max_ids,
                             priority_aging=settings.priority_aging,
                             call_timeout=settings.call_timeout, loop_blocked=self._loop_blocked,
                             fairness_weights=app.weights_by_queue)
        self.served = ServedQueues(self.broker, self.queues, app.partitions)
        self.limits = RouteLimits(app, settings.route_concurrency)
        self.slots = Slots(self.concurrency, self.broker, self.id, run=self._process,
                           admit=self._admit, limits=self.limits.encoded,
                           deep=settings.strict_priority or len(self.queues) == 1)
        self._hurry = asyncio.Event()
        # a drain that waits for every running handler however long it takes (its own timeout
        # bounds it): a process replaced past its limits; `_impatient` bounds it again
        self._patient = False
        self._impatient = asyncio.Event()
        self._loops: list[BackgroundLoop] = []
        self._aggregation: AggregationLoop | None = None  # stopped first when draining
        self.claims = Claims()  # the attempts it holds, which its heartbeat thread extends
        self._liveness: Liveness | None = None
        self.fetching = FetchProgress(settings.wait_timeout, settings.call_timeout)
        # told the event loop's lag and how long the fetch loop is stalled twice a second,
        # and of each loss of Redis's data (metrics)
        self.loop_lag_hooks: Hooks[[float]] = Hooks("loop-lag hook")
        self.fetch_stall_hooks: Hooks[[float]] = Hooks("fetch-stall hook")
        self.data_lost_hooks: Hooks[[]] = Hooks("data-lost hook")

    # -- public ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until stop() or SIGTERM/SIGINT, then drain. Raises ConfigurationError at
        once for a wrong URL, credentials or Redis version. A stop signal during start-up
        (the handlers come first) drains as soon as the worker has started."""
        remove_signals = on_stop_signals(self._on_signal) if self.handle_signals else None
        try:
            fetching = await self._start_serving()
            try:
                await self.slots.stopped.wait()
            finally:
                await self._drain(fetching)
        finally:
            if remove_signals is not None:
                remove_signals()

    async def _start_serving(self) -> asyncio.Task[None]:
        """Check Redis, register, start the background loops and the fetch loop."""
        s = self.settings
        policy = await self._reach_redis()
        liveness = Liveness(
            self.broker, self.id, s, self.claims, describe=self.describe,
            running=self.slots.running.get, memory_policy=policy,
            subscriptions=[(sub.event, sub.name, sub.queue) for sub in self.subscriptions],
            fetching=self.fetching, lag_hooks=self.loop_lag_hooks,
            fetch_hooks=self.fetch_stall_hooks, data_lost_hooks=self.data_lost_hooks)
        self.executor = Executor(self.app, self.concurrency, self._update_state, pool=s.pool,
                                 on_stuck=self._stuck_changed,
                                 loop_blocked=liveness.monitor.blocked,
                                 recycling=Recycling(s.max_tasks_per_child,
                                                     s.max_memory_per_child))
        self.settler = Settler(self.broker, self.id, self.app.outcome_hooks,
                               unknown_type_max_age=s.unknown_type_max_age, claims=self.claims)
        self._liveness = liveness
        self.started_at = time.time()  # in the first heartbeat's description already
        await liveness.start()  # registers its subscriptions before it serves
        self._flows = FlowLoop(self.broker, self.served.names, self.app.flow_hooks, self.id,
                               s.lock_ttl)
        self._loops = [
            self._flows,
            Forwarder(self.broker, self.id, s.forward_interval, s.lock_ttl),
            Recoverer(self.broker, self.id, s.recover_interval, s.lock_ttl,
                      max_recoveries=s.max_recoveries, hooks=self.app.recovery_hooks),
            Janitor(self.broker, self.id, s.janitor_interval, s.lock_ttl,
                    dead_max_age=s.dead_max_age, dead_max_count=s.dead_max_count),
            ThroughputCounter(self.app, self.broker),
            CancelWatcher(self.broker, self.id, self.served.names, s.wait_timeout,
                          self._cancel),
        ]
        if self.app.aggregations:
            self._aggregation = AggregationLoop(self.app, self.broker, self.id,
                                                self.served.names, s.aggregate_interval,
                                                s.aggregate_lease, s.allow_eviction)
            self._aggregation.start()
        for loop in self._loops:
            loop.start()
        self.started.set()
        log.info("worker %s started: queues %s, concurrency %d, event loop %s, namespace %s "
                 "on Redis %s", self.id, ",".join(
                     f"{q}={w}" + (f" ({len(self.served.partitions[q])} partitions)"
                                   if len(self.served.partitions[q]) > 1 else "")
                     for q, w in self.queues.items()),
                 self.concurrency, described(s.loop), self.namespace, self.broker.safe_url)
        warn_if_not_the_apps("worker", self.namespace, self.app.namespace)
        fetcher = Fetcher(self.broker, self.settler, self.id, self.slots, served=self.served,
                          strict_priority=s.strict_priority, lease_seconds=s.lease_seconds,
                          wait_timeout=s.wait_timeout, progress=self.fetching,
                          give_back=self._give_back)
        return asyncio.create_task(fetcher.run(), name="obsq-fetch")

    def _loop_blocked(self) -> float:
        """Seconds the event loop has stood blocked (by a handler) since the worker started,
        which its Redis calls' deadlines do not count."""
        return self._liveness.monitor.blocked() if self._liveness is not None else 0.0

    async def _reach_redis(self) -> str | None:
        """Check Redis and register the queues served; its memory policy. Tried again
        while Redis does not answer yet (background.reach_redis)."""
        async def attempt() -> str | None:
            await self.broker.check()
            policy = await self.broker.check_memory_policy(
                refuse=not self.settings.allow_eviction)
            await self.served.refresh()
            await self.broker.register_queues(self.served.names)
            return policy

        return await reach_redis(f"worker {self.id}", self.broker.safe_url, attempt,
                                 self.slots.stopped)

    def stop(self, now: bool = False, *, patient: bool = False) -> None:
        """Begin a graceful drain; a second call, or `now`, stops waiting for running
        handlers (they are handed back). `patient` (a process replaced past its limits):
        the drain waits for every running handler to end, each within its own timeout, so
        none is handed back to run again; a later call makes it a graceful drain from then,
        bounded by the shutdown timeout."""
        if self._patient and not now:
            self._patient = False
            self._impatient.set()
            return
        if self.slots.stopped.is_set() or now:
            self._hurry.set()
        elif patient:
            self._patient = True
        self.slots.draining = True  # readiness fails from now, not when the run loop gets to it
        self.slots.stopped.set()

    def describe(self) -> dict[str, Any]:
        """What the heartbeat publishes in Redis, and the endpoint's status shows; `stalled`:
        the seconds its event loop and its fetch loop stand still now (0 while they run),
        which `obsq doctor` reports when the heartbeat goes on regardless."""
        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": self.queues, "served": self.served.names,
                "partitions": self.served.declared,
                "concurrency": self.concurrency, "busy": self.slots.busy,
                "started": self.started_at, "version": __version__,
                "processed": self.processed, "draining": self.draining,
                "subscriptions": [sub.task_type for sub in self.subscriptions],
                "pool": self.settings.pool, "stuck": self.health().stuck_slots,
                "maxmemory_policy": (self._liveness.heartbeat.memory_policy
                                     if self._liveness else None),
                "stalled": {"event_loop": round(self._liveness.monitor.lag(), 1)
                            if self._liveness else 0.0,
                            "fetch_loop": round(self.fetching.stalled(), 1)}}

    def health(self) -> WorkerHealth:
        """How the worker is; safe to call from another thread (the HTTP endpoint's)."""
        if self._liveness is None:  # still starting
            return WorkerHealth(started=False, draining=self.draining, redis_ok=False)
        stuck = self.executor.pool.stuck()
        return self._liveness.health(started=self.started.is_set(), draining=self.draining,
                                  stuck_slots=stuck.slots, stuck_seconds=stuck.longest)

    @property
    def busy(self) -> int:
        return self.slots.busy

    @property
    def in_flight(self) -> int:
        """Tasks fetched whose end is not recorded in Redis yet: running, settling, waiting
        in the buffer for a slot, or a flow's step whose flow has not recorded its end."""
        slots = self.slots
        return (len(slots.running) + len(slots.buffer) + len(slots.suspects.waiting)
                + self._flows.recording)

    @property
    def waiting_patiently(self) -> bool:
        """Draining with no limit on the running handlers' wait (`stop(patient=True)`)."""
        return self._patient

    @property
    def draining(self) -> bool:
        """Stopping: readiness fails, and nothing more starts."""
        return self.slots.draining

    # -- tasks ----------------------------------------------------------------------------

    def _admit(self, queue: str, fetched: Fetched) -> list[Task]:
        """The tasks of a fetch, each held by the worker (its lease kept, its own route
        limit counted) from now; the routes it left behind are told to the throttle hooks."""
        for task_type, reason in fetched.held:
            self._throttled(queue_of(queue), task_type, reason)
        if fetched.expired:
            self._expired(queue, fetched)
        tasks = []
        for raw in fetched.tasks:
            task = self.executor.build_task(queue, raw, fetched.now_ms, fetched.asked_at)
            self.claims.took(queue, task.id, task._attempt.fence)
            self.limits.took(task)
            if raw.waited:
                self._throttled(queue_of(queue), raw.type, "ordering")
            tasks.append(task)
        return tasks

    def _expired(self, queue: str, fetched: Fetched) -> None:
        """The tasks the fetch found past their expiry, ended dead unstarted: told to the
        outcome hooks (outcome `expired`), said in one line."""
        for raw in fetched.expired:
            task = self.executor.build_task(queue, raw, fetched.now_ms, fetched.asked_at)
            self.settler.report(task, "expired", TaskExpired(task.id))
        log.warning("%d task(s) of queue %s not started by their expiry were moved to dead "
                    "(TaskExpired): %s", len(fetched.expired), queue_of(queue),
                    ", ".join(f"{raw.id} ({raw.type})" for raw in fetched.expired[:5]) +
                    (", ..." if len(fetched.expired) > 5 else ""))

    async def _give_back(self, tasks: list[Task]) -> None:
        """Tasks fetched ahead that waited behind handlers that did not end: back to the
        head of their queue, for any worker (one Redis does not reach now lets their leases
        run out, and the recoverer requeues them)."""
        handed = await self.settler.hand_back(tasks)
        for task in tasks:
            self.limits.released(task)
        queues = ", ".join(sorted({queue_of(task.kept_in) for task in tasks}))
        log.info("worker %s handed %d task(s) fetched ahead back to queue %s for other "
                 "workers: no handler of its own ended for %g s%s", self.id, handed, queues,
                 BUFFER_HOLD, f"; {len(tasks) - handed} not started, taken over meanwhile"
                 if handed < len(tasks) else "")

    def _cancel(self, queue: str, task_id: str) -> None:
        """The task was cancelled: an async handler is cancelled (a plain one's process
        too), a plain function in a thread sees `task.cancelled`. The handler of one still
        waiting in the buffer never runs: it starts only to be settled."""
        task = self.slots.waiting(queue, task_id)
        if task is not None:
            task.cancelled = True
            self.slots.start(task)
            return
        for runner, task in self.slots.running.items():
            if (task.id, task.kept_in) == (task_id, queue) and not task.cancelled:
                task.cancelled = True
                route = self.app.route(task.type)
                if route is None or route.is_async or self.executor.pool.interrupts:
                    runner.cancel()
                return

    async def _process(self, task: Task) -> None:
        runner: asyncio.Task[None] = asyncio.current_task(  # type: ignore[assignment]
            self.slots.loop)
        started = time.monotonic()
        verdict = None  # None: nothing to record (taken over before it started)
        try:
            if not task.cancelled and (self._sure_to_run(task)
                                       or await self._still_to_run(task)):
                verdict = await (self._flows.run_step(task, self.executor.run)
                                 if task._attempt.flow_step else self.executor.run(task))
        except asyncio.CancelledError:
            if not task.cancelled:
                return  # stopped by the drain: it stays among the running, to be handed back
            uncancel(runner)  # caught: it counts no more while the outcome is settled
        finally:
            self.slots.ended(runner, task, time.monotonic() - started)
        if task.cancelled:  # the one place an attempt is judged cancelled: its result,
            verdict = Verdict("cancelled")  # if any, no longer matters
        if verdict is not None and self.settler.settle_later(
                task, verdict, lambda: self._settled(runner, task)):
            return
        try:
            if verdict is not None:
                await self.settler.settle(task, verdict)
                self._ended(task)
            else:
                self.claims.released(task.kept_in, task.id, task._attempt.fence)
        finally:
            self._released(runner, task)

    def _settled(self, runner: asyncio.Task[None], task: Task) -> None:
        """A success gathered by settle_later is recorded (or given up on)."""
        self._ended(task)
        self._released(runner, task)

    def _ended(self, task: Task) -> None:
        """Its end is recorded: a flow's step is recorded in its flow next."""
        self.processed += 1
        if task._attempt.flow_step:
            self._flows.ended(task)

    def _released(self, runner: asyncio.Task[None], task: Task) -> None:
        self.limits.released(task)
        self.slots.settled(runner)

    def _sure_to_run(self, task: Task) -> bool:
        """The common case, known without a wait: no suspect, no doubt about the claims."""
        return (not task._attempt.suspect
                and not self._liveness.in_doubt(task))  # type: ignore[union-attr]

    async def _still_to_run(self, task: Task) -> bool:
        """Whether a started task still runs here: a suspect first gets to run alone, and a
        task fetched before the worker's claims were in doubt is still its own."""
        if task._attempt.suspect and not await self.slots.suspects.start_alone(task):
            return False
        return await self._liveness.still_ours(task)  # type: ignore[union-attr]

    def _throttled(self, queue: str, task_type: str, reason: str) -> None:
        route = self.app.route(task_type)
        self.app.throttle_hooks(queue, route.pattern if route else "other", reason)

    def _stuck_changed(self) -> None:
        self.app.stuck_hooks(self.executor.pool.stuck().slots)

    async def _update_state(self, task: Task, state: Any) -> None:
        await self.broker.set_progress(task.kept_in, task.id, state,
                                       self.settings.progress_ttl)

    # -- stopping -------------------------------------------------------------------------

    async def _drain(self, fetching: asyncio.Task[None]) -> None:
        self.slots.draining = True
        self.slots.stopped.set()
        if self._aggregation is not None:  # its batches go to other workers at once
            await self._aggregation.stop()
        self.slots.freed.set()  # a fetcher waiting for room sees the stop and ends
        # Not cancelled: a fetch cut short would strand the completions it carries (their
        # handlers would wait for them until the shutdown timeout) and the tasks it took.
        if not (await asyncio.wait([fetching], timeout=FETCH_STOP_TIMEOUT))[0]:
            fetching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetching
        self.settler.direct = True  # no fetch loop carries completions any more
        with contextlib.suppress(BrokerError):
            await self.settler.acks.flush()
        unstarted = self.slots.unstarted()
        if unstarted:
            await self.settler.hand_back(unstarted)
        handling = self.slots.handling
        log.info("worker %s draining: %d task(s) running, waiting %s", self.id,
                 len(handling), "for them to end" if self._patient else
                 f"up to {self.settings.shutdown_timeout:g} s")
        if handling:
            hurry = asyncio.ensure_future(self._hurry.wait())
            ended: asyncio.Future[Any] = asyncio.gather(*handling, return_exceptions=True)
            if self._patient:  # a replaced process: its tasks end by their own timeouts
                impatient = asyncio.ensure_future(self._impatient.wait())
                await asyncio.wait([ended, hurry, impatient], return_when=asyncio.FIRST_COMPLETED)
                impatient.cancel()
            # the first to end: the running tasks, or a hurry
            await asyncio.wait([ended, hurry], timeout=self.settings.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
        cancelled = list(handling)
        for runner in cancelled:
            runner.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        # those that ended anyway settled themselves (a plain handler past its timeout
        # records its TaskTimeout); the ones the cancel stopped are handed back
        unfinished = [self.slots.running[r] for r in cancelled if r in self.slots.running]
        for runner in cancelled:
            if runner in self.slots.running:
                self.slots.settled(runner)
        if unfinished:
            handed = await self.settler.hand_back(unfinished)
            log.info("handed %d unfinished task(s) back to pending%s", handed,
                     f" ({len(unfinished) - handed} had ended)" if handed < len(unfinished)
                     else "")
        await self.settler.acks.close(timeout=self.settings.settle_timeout)
        settling = [r for r in self.slots.running if not r.done()]
        if settling:
            await asyncio.wait(settling, timeout=self.settings.settle_timeout)
        for loop in reversed(self._loops):
            await loop.stop()
        await self._liveness.stop()  # type: ignore[union-attr]
        self.executor.close()
        await self.broker.close()
        log.info("worker %s stopped: %d task(s) processed", self.id, self.processed)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s: %s", sig.name,
                 "stopping now" if self.slots.stopped.is_set() else
                 f"draining, up to {self.settings.shutdown_timeout:g} s (a second signal "
                 "stops at once, handing the running tasks back)")
        self.stop()
