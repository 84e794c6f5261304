"""`obsq scheduler`: fires the schedule entries of a namespace, those of its App's code
(`app.periodic`, written to Redis by the scheduler) and those clients add and remove at run
time (`client.schedule`). Any number of replicas may run: one holds the lock and fires, and
another takes over within 1.5 lock TTLs when it dies.

Each fire is claimed in Redis (the entry's next fire moves on from the value read, once),
its task enqueued through the scheduler's Client (producer hooks, tracing and enqueue
metrics apply) under an id made of the fire time, and the claim confirmed; fires of one
entry due together (a round that came late) are claimed, enqueued and confirmed as one
batch. A claim left unconfirmed by a scheduler that died is finished by the next one under
the same ids, which Redis refuses twice; fire tasks are kept at least `missed_after` after
they end, so that refusal holds even for a task that already ran.

The lock holder blocks on Redis until its next fire or until an entry changes: entries
added or removed at run time are picked up at once, with no polling.

Like the Worker it knows nothing of metrics or HTTP: obsq.observability.run_scheduler
serves its probes and metrics, through `on_fire`, `on_entries`, `ready()` and
`describe()`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from obsq._version import __version__
from obsq.app import App, Hooks
from obsq.background import LockedLoop, on_stop_signals, reach_redis
from obsq.broker import Broker
from obsq.clock import Clock
from obsq.errors import BrokerError
from obsq.names import warn_if_not_the_apps
from obsq.producer.client import Client
from obsq.schedule import Schedule, claim_text, fire_text, fires_text, parse_claim
from obsq.settings import (
    DEFAULT_REDIS_URL,
    SCHEDULE_DUE_BATCH,
    SCHEDULE_FIRE_BATCH,
    SCHEDULER_WAIT_SLACK,
    STOP_WAIT,
    SchedulerSettings,
)
from obsq.task import Job, TaskInfo

log = logging.getLogger("obsq")

FIRES_SUMMARY_EVERY = 3600.0  # seconds between two counts of an entry's fires at INFO
FireHook = Callable[[str, str, int], None]  # (entry, "fired" or "missed", count)
EntriesHook = Callable[[list[str]], None]  # the names of the entries known now
INF = float("inf")


class SchedulerLoop(LockedLoop):
    name = "scheduler"

    def __init__(self, client: Client, app_entries: dict[str, Schedule], owner: str,
                 settings: SchedulerSettings) -> None:
        super().__init__(client.broker, owner, settings.lock_ttl / 3, settings.lock_ttl)
        self.client = client
        self.app_entries = app_entries
        self.missed_after = settings.missed_after
        self.fire_hooks: Hooks[[str, str, int]] = Hooks("schedule-fire hook")
        self.entries_hooks: Hooks[[list[str]]] = Hooks("schedule-entries hook")
        self.entries: dict[str, Schedule] = {}  # the valid entries in Redis
        self.stored: dict[str, bytes] = {}  # every entry in Redis, as stored
        self.version = -1  # of the entries last read
        self.holding = False  # the lock, in the last round
        # fires said at INFO: an entry's first, then a count an hour (each at DEBUG): an
        # `@every 5s` entry would otherwise write 17,000 lines a day. Entry -> (fires, since:
        # a fire time in seconds)
        self._fires_since: dict[str, tuple[int, float]] = {}

    async def tick(self) -> float | None:
        self.holding = False
        return await super().tick()

    async def work(self) -> float:
        """One round: finish claims left unconfirmed, fire what is due; returns how long
        to wait for the next fire (or a change of the entries), at most a third of the
        lock's TTL so that the lock is kept."""
        self.holding = True
        started = self.clock.monotonic()
        state = await self.broker.due_fires(SCHEDULE_DUE_BATCH)
        if state.version != self.version:
            await self._load(state.version)
        for name, claim in state.firing.items():
            await self._finish(name, claim, state.now_ms)
        soonest = INF if state.soonest_ms is None else state.soonest_ms
        for name, next_ms in state.due:
            soonest = min(soonest, await self._advance(name, next_ms, state.now_ms))
        if len(state.due) == SCHEDULE_DUE_BATCH:
            return 0.0  # more are due
        wait = (soonest - state.now_ms) / 1000 - (self.clock.monotonic() - started)
        return min(max(wait, 0.0), self.interval)

    async def sleep(self, seconds: float) -> None:
        """The lock holder waits on Redis, which an entry's change ends at once; a stop
        ends it through the same list. Redis ends a blocking wait up to SCHEDULER_WAIT_SLACK
        late, so the last moments before a fire are slept here."""
        if (not self.holding or seconds < 2 * SCHEDULER_WAIT_SLACK
                or not self.clock.read_by_scripts):
            return await super().sleep(seconds)
        waiter = asyncio.ensure_future(self.broker.wait_schedule_change(
            seconds - SCHEDULER_WAIT_SLACK))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([waiter, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not waiter.done():
            with contextlib.suppress(BrokerError):
                await self.broker.interrupt_schedule_wait()
            await asyncio.wait([waiter], timeout=STOP_WAIT)
        if not waiter.done():
            waiter.cancel()
        # a failed wait needs no report: the next round's calls fail and are retried
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())

    # -- the entries ------------------------------------------------------------------------

    async def _load(self, version: int) -> None:
        """Read every entry again (the version changed), keep the valid ones, log each
        stored form that is not valid once, and write the App's entries where they differ."""
        stored = await self.broker.schedule_entries()
        entries = {}
        for name, raw in stored.items():
            if self.stored.get(name) == raw and name in self.entries:
                entries[name] = self.entries[name]
                continue
            try:
                entries[name] = Schedule.decode(name, raw)
            except ValueError as exc:
                if self.stored.get(name) != raw:
                    log.error("%s; it is skipped until it is written again", exc)
        self.stored, self.entries, self.version = stored, entries, version
        await self._write_app_entries()
        self.report_entries()

    async def _write_app_entries(self) -> None:
        """The App's code is the source of its entries: write those Redis lacks or holds
        otherwise, remove those the code no longer has."""
        for name, entry in self.app_entries.items():
            encoded = entry.encoded()
            if self.stored.get(name) == encoded:
                continue
            replaced = self.entries.get(name)
            await self.broker.put_schedule(name, encoded, from_app=True)
            if replaced is not None and replaced.source != "app":
                log.warning("schedule %s of the App's code replaces the entry a client added "
                            "under that name", name)
            log.info("schedule %s (%s, %s) written from the App's code", name, entry.spec,
                     entry.task_type)
        for name, entry in self.entries.items():
            if entry.source == "app" and name not in self.app_entries:
                await self.broker.remove_schedule(name, from_app=True)
                log.info("schedule %s removed: the App's code no longer has it", name)

    def report_entries(self) -> None:
        names = sorted({*self.app_entries, *self.entries})
        self.entries_hooks(names)

    def _report(self, name: str, outcome: str, count: int) -> None:
        self.fire_hooks(name, outcome, count)

    # -- fires ------------------------------------------------------------------------------

    async def _advance(self, name: str, next_ms: float, now_ms: int) -> float:
        """Fire what is due of one entry; returns its next fire (inf: not known here)."""
        entry = self.entries.get(name)
        if entry is None:
            raw = self.stored.get(name)
            if raw is not None:  # not valid: parked until it is written again
                await self.broker.claim_fire(name, hashlib.sha1(raw).hexdigest(), next_ms, INF)
            return INF
        if next_ms == 0:  # new or changed: its first fire counts from now
            first = entry.next_after(now_ms)
            await self.broker.claim_fire(name, entry.digest, 0, first)
            return first
        plan = entry.plan(int(next_ms), now_ms, round(self.missed_after * 1000))
        expected: float = next_ms
        if plan.missed or plan.catch_up is not None:
            following = plan.fires[0] if plan.fires else plan.following
            caught_up = () if plan.catch_up is None else (plan.catch_up,)
            if not await self._claim(entry, expected, following, caught_up, plan.missed):
                return INF
            expected = following
        fires = plan.fires  # due together (a late round): claimed and enqueued in batches
        for start in range(0, len(fires), SCHEDULE_FIRE_BATCH):
            end = start + SCHEDULE_FIRE_BATCH
            following = fires[end] if end < len(fires) else plan.following
            if not await self._claim(entry, expected, following, fires[start:end]):
                return INF  # another scheduler moved it on, or it changed
            expected = following
        return plan.following

    async def _claim(self, entry: Schedule, expected: float, following: float,
                     fires: tuple[int, ...], missed: int = 0) -> bool:
        """Claim `fires` (none: only move the next fire on, counting `missed` fires), then
        enqueue them and confirm the claim."""
        claim = claim_text(fires, entry.encoded()) if fires else b""
        if not await self.broker.claim_fire(entry.name, entry.digest, expected, following,
                                            fires[0] if fires else 0, claim, missed):
            self.version = -1  # moved on or changed meanwhile: read the entries again
            return False
        if missed:
            log.warning("schedule %s missed %d fire(s) while no scheduler ran (missed=%s)",
                        entry.name, missed, entry.missed)
            self._report(entry.name, "missed", missed)
        if fires:
            await self._fire(entry, fires, claim)
        return True

    async def _fire(self, entry: Schedule, fires: tuple[int, ...], claim: bytes) -> None:
        """Enqueue the tasks of claimed fires in one batch, then confirm the claim."""
        jobs = [Job(entry.task_type, entry.payload,
                    **entry.enqueue_options(fire, min_retention=self.missed_after))
                for fire in fires]
        try:
            infos = await self.client.enqueue_many(jobs)
        except ValueError as exc:  # refused (a payload over its route's limit, a type with
            # no handler): each claim says so, and the other entries go on
            log.error("schedule %s: %s was not enqueued: %s", entry.name, fires_text(fires),
                      exc)
            await self.broker.confirm_fire(entry.name, claim, fires[-1], "dropped", len(fires))
            return
        for fire, info in zip(fires, infos):
            if info.duplicate:
                log.info("schedule %s: the fire of %s was enqueued already", entry.name,
                         fire_text(fire))
            else:
                self._said_fire(entry.name, fire, info)
        if await self.broker.confirm_fire(entry.name, claim, fires[-1], "fired", len(fires)):
            self._report(entry.name, "fired", len(fires))

    def _said_fire(self, name: str, fire: int, info: TaskInfo) -> None:
        """An entry's first fire at INFO, the others at DEBUG with a count an hour at INFO;
        the hour is of fire times, so fires enqueued together count where they belong."""
        at = fire / 1000
        fires, since = self._fires_since.get(name, (-1, at))
        if fires < 0:
            log.info("schedule %s fired (%s) as task %s in queue %s; its later fires are "
                     "logged at DEBUG, with a count an hour", name, fire_text(fire), info.id,
                     info.queue)
            self._fires_since[name] = (0, at)
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("schedule %s fired (%s) as task %s in queue %s", name, fire_text(fire),
                      info.id, info.queue)
        if at - since >= FIRES_SUMMARY_EVERY:
            log.info("schedule %s fired %d time(s) in the last %.0f minutes", name, fires + 1,
                     (at - since) / 60)
            self._fires_since[name] = (0, at)
        else:
            self._fires_since[name] = (fires + 1, since)

    async def _finish(self, name: str, claim: bytes, now_ms: int) -> None:
        """A claim left unconfirmed: its scheduler died (or lost the lock) between the
        claim and the confirmation. Enqueued again under the fires' ids while that is safe:
        the latest fire, no later than the claim, not more than `missed_after` ago."""
        try:
            fires, definition = parse_claim(claim)
            entry = Schedule.decode(name, definition)
        except ValueError as exc:
            log.error("schedule %s: a claimed fire in Redis is not readable (%s); dropped",
                      name, exc)
            await self.broker.confirm_fire(name, claim, 0, "dropped", 0)
            return
        if now_ms - fires[-1] > self.missed_after * 1000:
            log.warning("schedule %s: %s was claimed by a scheduler that did not confirm it, "
                        "more than %g s ago; counted missed, not enqueued again (its task may "
                        "have run)", name, fires_text(fires), self.missed_after)
            if await self.broker.confirm_fire(name, claim, fires[-1], "missed", len(fires)):
                self._report(name, "missed", len(fires))
            return
        log.info("schedule %s: finishing %s, which a scheduler claimed and did not confirm",
                 name, fires_text(fires))
        await self._fire(entry, fires, claim)


class Scheduler:
    def __init__(self, app: App, redis_url: str = DEFAULT_REDIS_URL,
                 namespace: str | None = None, *, settings: SchedulerSettings | None = None,
                 handle_signals: bool = True, clock: Clock | None = None) -> None:
        """`clock`: the time its fires count by (None: Redis's)."""
        self.app = app
        self.handle_signals = handle_signals
        self.settings = settings or SchedulerSettings()
        namespace = namespace or app.namespace
        # its own calls (the lock, the due fires, the wait for a change) have a deadline,
        # as a worker's; its Client hears of their failures through the broker's hooks
        errors: Hooks[[str, BaseException]] = Hooks("Redis-error hook")
        broker = Broker(redis_url, namespace, clock=clock, on_error=errors,
                        call_timeout=self.settings.call_timeout)
        self.client = Client(namespace=namespace, app=app, broker=broker,
                             allow_eviction=self.settings.allow_eviction,
                             call_timeout=self.settings.call_timeout)
        self.loop = SchedulerLoop(self.client, app.schedules,
                                  f"scheduler-{id(self):x}-{time.time_ns()}", self.settings)
        self.started_at = 0.0
        self._stopped = asyncio.Event()

    def on_fire(self, hook: FireHook) -> FireHook:
        """Call `hook(entry, outcome, count)` when fires are enqueued ("fired") or skipped
        by their entry's missed policy ("missed"). Hooks must be quick and must not raise."""
        self.loop.fire_hooks.append(hook)
        return hook

    def on_entries(self, hook: EntriesHook) -> EntriesHook:
        """Call `hook(names)` with the names of the entries known: at once (the App's) and
        whenever they change."""
        self.loop.entries_hooks.append(hook)
        hook(sorted({*self.app.schedules, *self.loop.entries}))
        return hook

    async def run(self) -> None:
        """Fire due entries until stop() or SIGTERM/SIGINT."""
        remove_signals = on_stop_signals(lambda sig: self.stop()) if self.handle_signals \
            else None  # first: none is missed
        try:
            await reach_redis("scheduler", self.client.broker.safe_url, self._reach,
                              self._stopped)
            log.info("scheduler started with %d schedule(s) of the App in namespace %s; entries "
                     "added at run time are read from Redis", len(self.app.schedules),
                     self.client.namespace)
            warn_if_not_the_apps("scheduler", self.client.namespace, self.app.namespace)
            self.started_at = time.time()
            self.loop.start()
            await self._stopped.wait()
        finally:
            if remove_signals is not None:
                remove_signals()
            await self.loop.stop()
            await self.client.close()
            if self.started_at:  # a failed start is its one error line
                log.info("scheduler stopped")

    async def _reach(self) -> None:
        """Check Redis and its memory policy (tried again while Redis does not answer)."""
        await self.client.broker.check()
        await self.client.broker.check_memory_policy(refuse=not self.settings.allow_eviction)

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
                "namespace": self.client.namespace, "app_schedules": len(self.app.schedules),
                "schedules": len({*self.app.schedules, *self.loop.entries}),
                "holds_lock": self.loop.holding, "redis_ok": self.loop.failures == 0,
                "uptime": round(time.time() - self.started_at, 3) if self.started_at else 0.0}
