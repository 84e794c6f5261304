"""What keeps a worker alive and tells how it is, whatever its handlers do. `Liveness` holds
the parts, in the order of this file: the heartbeat thread and the claims it extends, the
event-loop monitor and its watchdog, and the WorkerHealth the probes judge by.

The heartbeat thread keeps the worker's claims alive: its heartbeat (so the recoverer takes
its tasks back within seconds if it dies) and its leases (so a long task is not taken from
a worker that is still running it), with a blocking Redis client of its own
(obsq/broker/keeping.py). A handler that blocks the event loop (a sync call in an `async
def`) therefore cannot make a live worker look lost, nor its tasks run twice. The same
thread renews the worker's event subscriptions after each heartbeat (a full Redis refuses
them, never the heartbeat), reads Redis's maxmemory-policy again now and then (a change to
a policy that evicts is warned about, not refused: the running tasks are better finished),
and reads the namespace's data-set token with each heartbeat: a token gone or changed means
Redis lost its data, said as an error once per loss; the heartbeat registers the queues and
subscriptions again, so the worker carries on. It also tells the worker whether its claims
were in doubt (a silence long enough for them to be taken over, such as a SIGSTOP), so that
a task fetched before it is checked in Redis before its handler starts. Its calls end within
a deadline short enough that a beat lost on a connection the network dropped silently is
sent again on a fresh one before the worker's key expires; and an attempt whose end has not
reached Redis within a lease is no longer extended, so that a settle that cannot get
through does not hold its task (and its flow) for as long as the worker lives.

The loop monitor watches for handlers that block the event loop: how late the loop runs
(its lag, for the metric and the liveness probe), a watchdog thread that names the blocking
handler and logs where it blocks, and the time the loop stood blocked, which handler
timeouts and Redis calls' deadlines do not count (a handler awaiting I/O has not overrun its
timeout because another held the loop; one that blocks the loop itself cannot be
interrupted, and once it returns its work is done). The same watchdog watches the fetch
loop come round (`FetchProgress`): every call it makes ends within its deadline, so one
that has not come round for longer than its longest call and a retry's pause is stuck, and
the worker, ready as it may look, takes no task.

Health: liveness judges the process alone (its event loop runs, or has not been blocked
longer than the limit; its heartbeat thread and fetch loop come round; not every slot stuck
too long): a restart would fix what it fails on. Redis belongs to readiness: a Redis outage
restarting every worker at once would only add a restart storm to it. Each check is one
small function of WorkerHealth returning the reason it fails, or None; add one to LIVENESS
or READINESS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from obsq.app import Hooks
from obsq.background import RedisRetry
from obsq.broker import Attempt, Broker
from obsq.broker.keeping import BlockingKeeping
from obsq.broker.startup import eviction_problem
from obsq.errors import BrokerError
from obsq.settings import REDIS_RETRY_MAX, SAFE_MEMORY_POLICY, WorkerSettings
from obsq.task import Task

log = logging.getLogger("obsq")


class Liveness:
    """Started on the worker's event loop once Redis answered; stopped last."""

    def __init__(self, broker: Broker, worker_id: str, settings: WorkerSettings,
                 claims: Claims, *, describe: Callable[[], dict[str, Any]],
                 running: Callable[[asyncio.Task[Any]], Task | None],
                 memory_policy: str | None, subscriptions: Sequence[tuple[str, str, str]],
                 fetching: FetchProgress, lag_hooks: Hooks[[float]],
                 fetch_hooks: Hooks[[float]], data_lost_hooks: Hooks[[]]) -> None:
        """`running(asyncio task)`: the obsq Task it runs, if any; `fetching`: the fetch
        loop's rounds."""
        s = self.settings = settings
        self.broker = broker
        self.worker_id = worker_id
        self.running = running
        self.monitor = LoopMonitor(asyncio.get_running_loop())
        self.fetching = fetching
        self.heartbeat = Heartbeat(
            BlockingKeeping(broker, call_timeout=heartbeat_call_timeout(s)), worker_id,
            describe, claims, interval=s.heartbeat_interval, ttl=s.heartbeat_ttl,
            lease_seconds=s.lease_seconds, policy_interval=s.policy_check_interval,
            memory_policy=memory_policy, subscriptions=subscriptions,
            subscription_ttl=s.subscription_ttl, data_lost_hooks=data_lost_hooks)
        self.watchdog = LoopWatchdog(self.monitor, s.blocked_loop_warning,
                                     self._handler_on_loop, lag_hooks, fetching, fetch_hooks)

    async def start(self) -> None:
        """Beat once (registering the subscriptions before the worker serves; a Redis that
        refuses raises BrokerError), then start the threads and the monitor."""
        await asyncio.to_thread(self.heartbeat.begin)
        self.heartbeat.start()
        self.monitor.start()
        self.watchdog.start()

    async def stop(self) -> None:
        """Stop the threads and deregister the worker."""
        self.monitor.stop()
        await asyncio.to_thread(self.watchdog.stop)
        await asyncio.to_thread(self.heartbeat.stop)

    def health(self, **worker: Any) -> WorkerHealth:
        """Safe to call from any thread (the HTTP endpoint's); `worker`: the fields the
        worker itself knows (started, draining, stuck slots)."""
        s, heartbeat = self.settings, self.heartbeat
        silent = time.monotonic() - heartbeat.last_success
        return WorkerHealth(
            heartbeat_age=silent, redis_ok=heartbeat.retry.failures == 0,
            redis_answers=silent < 2 * s.heartbeat_interval, loop_lag=self.monitor.lag(),
            loop_limit=s.blocked_loop_limit, heartbeat_stalled=heartbeat.stalled_for(),
            fetch_silent=self.fetching.silent(), fetch_limit=self.fetching.limit,
            slots=s.concurrency, stuck_limit=s.stuck_limit, **worker)

    def in_doubt(self, task: Task) -> bool:
        """Whether the worker's claims were in doubt since the task was fetched (a silence
        long enough for them to be taken over, such as a SIGSTOP): then still_ours asks."""
        return self.heartbeat.doubts(task._attempt.asked_at)

    async def still_ours(self, task: Task) -> bool:
        """Whether to run a task: yes, unless its worker's claims were in doubt since it was
        fetched and Redis says another attempt holds it now. Then it is dropped, not run
        twice."""
        if not self.in_doubt(task):
            return True
        held = await self.broker.still_held(task.kept_in, [Attempt(task.id, task._attempt.fence)],
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


def heartbeat_call_timeout(s: WorkerSettings) -> float:
    """The deadline of each call of the heartbeat thread: the worker's call deadline, at
    most half the time between a beat and the expiry of the worker's key, so that a beat
    lost on a connection the network dropped silently is sent again on a fresh one in time
    (and a stop never hangs on an unanswered call)."""
    return min(s.call_timeout, (s.heartbeat_ttl - s.heartbeat_interval) / 2)


log = logging.getLogger("obsq")


# -- the heartbeat thread and the claims it extends ---------------------------------------


class Claims:
    """The attempts a worker holds (buffered, running, or being settled), shared with its
    heartbeat thread. An attempt whose end is being recorded is `ending`: its lease is
    still extended (for a lease at most: Heartbeat.extend), but a lease the extension finds
    gone was ended by the worker itself (the settle reached Redis first), not lost.

    Only the worker's event loop changes them, and the heartbeat thread only reads: each
    change is one dict or set operation, atomic under the GIL, and the thread iterates a
    copy made in one call, so no lock is taken (three per task cost a busy worker 3 µs of
    each task's CPU)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], int] = {}  # (queue, id) -> fence
        self._ending: set[tuple[str, str]] = set()
        # when the heartbeat last found that Redis lost its data (monotonic; 0: never): an
        # attempt fetched before it whose end Redis refuses was lost with it, not taken over
        self.data_lost_at = 0.0

    def took(self, queue: str, task_id: str, fence: int) -> None:
        self._ending.discard((queue, task_id))  # first: an older attempt's end is not this
        self._held[queue, task_id] = fence

    def ending(self, queue: str, task_id: str) -> None:
        self._ending.add((queue, task_id))

    def released(self, queue: str, task_id: str, fence: int) -> None:
        key = (queue, task_id)
        if self._held.get(key) == fence:
            del self._held[key]
            self._ending.discard(key)

    def by_queue(self, leaving_out: Collection[tuple[str, str, int]] = ()
                 ) -> dict[str, list[Attempt]]:
        """The attempts held, but those of `leaving_out` (queue, id, fence)."""
        attempts: dict[str, list[Attempt]] = {}
        for (queue, task_id), fence in self._held.copy().items():
            if (queue, task_id, fence) not in leaving_out:
                attempts.setdefault(queue, []).append(Attempt(task_id, fence))
        return attempts

    def ending_now(self) -> set[tuple[str, str, int]]:
        """(queue, id, fence) of the attempts whose end is being recorded."""
        held = self._held.copy()
        return {(queue, task_id, held[queue, task_id]) for queue, task_id
                in self._ending.copy() if (queue, task_id) in held}

    def really_lost(self, queue: str, ids: Sequence[str], sent: Sequence[Attempt]
                    ) -> list[str]:
        """Of the ids an extension found lost, those the worker still holds with the fence
        it sent and is not ending itself."""
        fences = {a.task_id: a.fence for a in sent}
        return [i for i in ids if (queue, i) not in self._ending
                and self._held.get((queue, i)) == fences.get(i)]


class Heartbeat:
    """The heartbeat thread. `begin()` (before the worker serves) reads the data-set token
    and beats once, raising BrokerError when Redis refuses; `start()` runs the thread,
    `stop()` ends it and deregisters the worker."""

    def __init__(self, calls: BlockingKeeping, worker_id: str,
                 describe: Callable[[], dict[str, Any]], claims: Claims, *,
                 interval: float, ttl: float, lease_seconds: float, policy_interval: float,
                 memory_policy: str | None = None,
                 subscriptions: Sequence[tuple[str, str, str]] = (),
                 subscription_ttl: float = 0.0,
                 data_lost_hooks: Hooks[[]] | None = None) -> None:
        """`memory_policy`: the one read at start (None: unknown)."""
        self.calls = calls
        self.worker_id = worker_id
        self.describe = describe
        self.claims = claims
        self.interval = interval
        self.ttl = ttl
        self.lease_seconds = lease_seconds
        self.policy_interval = policy_interval
        self.memory_policy = memory_policy
        self.subscriptions = list(subscriptions)
        self.subscription_ttl = subscription_ttl
        self.data_lost_hooks = (Hooks("data-lost hook") if data_lost_hooks is None
                                else data_lost_hooks)
        self.retry = RedisRetry("heartbeat")
        # claims are in doubt after a silence this long: the worker's key may have expired
        # (ttl after the last beat) or a lease run out
        self.doubt_after = max(min(ttl, lease_seconds) - interval, interval)
        self.last_success = time.monotonic()  # of the last heartbeat Redis accepted
        self.gap_ended_at = 0.0  # the first success after the last silence of doubt_after
        self.moved_at = time.monotonic()  # the thread's last round, or the end of a call
        self.calling = False  # inside a Redis call (which a hung Redis may hold)
        self._dataset = b""
        self._data_lost = False  # since the last extension: lost leases are said as such
        # the ends under way the extensions saw (queue, id, fence), and since when; those
        # seen for a lease or more are extended no more (said once)
        self._ends_seen: dict[tuple[str, str, int], float] = {}
        self._overdue: set[tuple[str, str, int]] = set()
        self._policy_read_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the worker asks -------------------------------------------------------------

    def doubts(self, since: float) -> bool:
        """Whether the worker's claims may have been taken over since `since` (monotonic):
        Redis has not taken a heartbeat for doubt_after, or did not for that long since."""
        return (time.monotonic() - self.last_success >= self.doubt_after
                or self.gap_ended_at >= since)

    def stalled_for(self) -> float:
        """Seconds the thread has not come round, not counting a Redis call under way (a
        hung Redis is readiness's matter); 0 while it turns as it should."""
        if self._thread is None or self.calling or self._stop.is_set():  # stopped: no fault
            return 0.0
        if not self._thread.is_alive():
            return float("inf")
        return max(time.monotonic() - self.moved_at - self.interval, 0.0)

    # -- the thread -----------------------------------------------------------------------

    def begin(self) -> None:
        self.beat()  # its data-set check reads the first token this worker knows

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="obsq-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # a thread still in a Redis call could beat after the deregistration and undo it
        if self._thread is None or not self._thread.is_alive():
            with contextlib.suppress(BrokerError):  # else its key expires by itself
                self.calls.deregister(self.worker_id)
        self.calls.close()

    def _run(self) -> None:
        now = time.monotonic()
        next_beat, next_extension = now + self.interval, now + self.lease_seconds / 3
        while not self._stop.wait(max(min(next_beat, next_extension) - time.monotonic(), 0)):
            now = self.moved_at = time.monotonic()
            self.calling = True
            try:
                if now >= next_beat:
                    next_beat = now + self.interval
                    self.beat()
                    self._read_policy()
                if now >= next_extension:
                    next_extension = now + self.lease_seconds / 3
                    self.extend()
                self.retry.succeeded()
            except BrokerError as exc:
                next_beat = next_extension = now + self.retry.failed(exc)
            except Exception:
                log.exception("heartbeat failed; retrying in %.1f s", self.interval)
            finally:
                self.calling = False
                self.moved_at = time.monotonic()

    def beat(self) -> None:
        self.calls.heartbeat(self.worker_id, self.describe(), self.ttl)
        now = time.monotonic()
        if now - self.last_success >= self.doubt_after:
            self.gap_ended_at = now
        self.last_success = now
        self._check_dataset()
        if self.subscriptions:  # a Redis at maxmemory refuses them; the heartbeat counts
            try:
                self.calls.subscribe(self.subscriptions, self.subscription_ttl)
            except BrokerError as exc:  # counted by the broker's hooks; tried next beat
                log.warning("event subscriptions not renewed: %s", exc)

    def extend(self) -> None:
        """Extend the leases held; an attempt whose end has not reached Redis within a lease
        is left to lapse (said once), and the recoverer takes its task back: a settle that
        cannot get through must not hold its task, and its flow, for as long as the worker
        lives."""
        now, seen = time.monotonic(), self._ends_seen
        self._ends_seen = {end: seen.get(end, now) for end in self.claims.ending_now()}
        overdue = {end for end, since in self._ends_seen.items()
                   if now - since >= self.lease_seconds}
        for queue, task_id, _ in overdue - self._overdue:
            log.warning("task %s of queue %s ended and its end has not reached Redis for "
                        "%g s (a lease): its lease is no longer extended, so it runs again "
                        "once the lease runs out", task_id, queue, self.lease_seconds)
        self._overdue = overdue
        attempts = self.claims.by_queue(leaving_out=overdue)
        lost = self.calls.extend(attempts, self.lease_seconds, self.worker_id) if attempts \
            else {}
        why = ("Redis lost its data" if self._data_lost
               else "taken over after the lease expired")
        self._data_lost = False
        for queue, ids in lost.items():
            ids = self.claims.really_lost(queue, ids, attempts[queue])
            if ids:
                log.warning("lease lost for %d running task(s) of queue %s (%s): %s",
                            len(ids), queue, why, ", ".join(ids[:10]))

    def _check_dataset(self) -> None:
        token = self.calls.dataset()
        if not token or token == self._dataset:
            return
        known, self._dataset = self._dataset, token
        if not known:  # the first token this worker reads
            return
        self._data_lost = True
        self.claims.data_lost_at = time.monotonic()
        log.error("Redis at %s lost its data (restarted without persistence, or flushed): "
                  "the tasks, schedules and results it held are gone; this worker registers "
                  "its queues and subscriptions again and carries on",
                  self.calls.broker.safe_url)
        self.data_lost_hooks()

    def _read_policy(self) -> None:
        if time.monotonic() - self._policy_read_at < self.policy_interval:
            return
        self._policy_read_at = time.monotonic()
        try:
            policy = self.calls.memory_policy()
        except BrokerError:
            return  # counted; the next read may succeed
        if policy is None or policy == self.memory_policy:
            return
        before, self.memory_policy = self.memory_policy, policy
        if policy != SAFE_MEMORY_POLICY:
            log.warning("%s (changed at run time from %s)",
                        eviction_problem(self.calls.broker.safe_url, policy), before)
        else:
            log.info("Redis's maxmemory-policy is %s again", policy)


log = logging.getLogger("obsq")
# -- the event loop's monitor and watchdog -------------------------------------------------

TICK = 0.1  # the monitor's period on the loop
BLOCKED_AT_LEAST = 0.25  # lateness below this is a busy loop, not a blocked one
STACK_FRAMES = 25  # of the loop thread's stack, in the watchdog's warning


class LoopMonitor:
    """A callback every TICK on the loop: how late it runs is the loop's lag, and the
    lateness past BLOCKED_AT_LEAST adds up to the time the loop stood blocked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread_id = threading.get_ident()  # made on the loop's thread
        self.blocked_total = 0.0
        self._due = loop.time() + TICK
        self._counted_to = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._due = self.loop.time() + TICK
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def lag(self) -> float:
        """How late the loop is now (any thread): 0 while it runs its callbacks in time."""
        if self._handle is None:
            return 0.0
        return max(time.monotonic() - self._due, 0.0)

    def blocked(self) -> float:
        """Seconds the loop has stood blocked since it started, counted up to now (call on
        the loop: each attempt of an async handler does)."""
        now = self.loop.time()
        late = now - max(self._due, self._counted_to)
        if late >= BLOCKED_AT_LEAST:
            self.blocked_total += late
            self._counted_to = now
        return self.blocked_total

    def _tick(self) -> None:
        self.blocked()
        self._due = self.loop.time() + TICK
        self._handle = self.loop.call_at(self._due, self._tick)


class FetchProgress:
    """When the fetch loop last came round, marked by the loop at each round and read from
    any thread. Every call it makes ends within its deadline, so a round lasts at most its
    longest call (the blocking wait plus the call deadline) and the pause after a failure:
    `limit`. One that has not come round for longer is stuck (or Redis timed out several
    calls of one round, which readiness says anyway)."""

    def __init__(self, wait_timeout: float, call_timeout: float) -> None:
        self.limit = wait_timeout + call_timeout + REDIS_RETRY_MAX
        self.at = 0.0  # the last round's start (monotonic); 0: the loop does not run

    def came_round(self) -> None:
        self.at = time.monotonic()

    def ended(self) -> None:
        self.at = 0.0

    def silent(self) -> float:
        """Seconds since the loop last came round; 0 while it does not run."""
        at = self.at
        return time.monotonic() - at if at else 0.0

    def stalled(self) -> float:
        """Seconds it has been silent past its limit; 0 while it comes round."""
        return max(self.silent() - self.limit, 0.0)


class LoopWatchdog:
    """A thread that looks at the loop's lag twice a second: past `warn_after` it logs the
    handler running on the loop (`running()`: who it is, or None) and the loop thread's
    stack, once per blocking; and it tells `lag_hooks` each lag it reads (the metric). It
    looks at the fetch loop too (`fetching`): one stalled past its limit is logged once, its
    round again once more, and `fetch_hooks` are told each stall it reads."""

    def __init__(self, monitor: LoopMonitor, warn_after: float,
                 running: Callable[[], str | None],
                 lag_hooks: Hooks[[float]] | None = None,
                 fetching: FetchProgress | None = None,
                 fetch_hooks: Hooks[[float]] | None = None) -> None:
        self.monitor = monitor
        self.warn_after = warn_after
        self.running = running
        self.lag_hooks = Hooks("loop-lag hook") if lag_hooks is None else lag_hooks
        self.fetching = fetching
        self.fetch_hooks = Hooks("fetch-stall hook") if fetch_hooks is None else fetch_hooks
        self.period = min(0.5, warn_after / 2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fetch_silent = 0.0  # the longest silence of the fetch loop warned about; 0: none

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="obsq-loop-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        longest = 0.0  # of the blocking warned about; 0: none
        while not self._stop.wait(self.period):
            lag = self.monitor.lag()
            self.lag_hooks(lag)
            if lag >= self.warn_after and not longest:
                self._warn(lag)
            if longest and lag < BLOCKED_AT_LEAST:
                log.warning("the event loop runs again after being blocked for %.1f s or more",
                            longest)
                longest = 0.0
            elif lag >= self.warn_after:
                longest = max(longest, lag)
            if self.fetching is not None:
                self._watch_fetching(self.fetching, lag)

    def _watch_fetching(self, fetching: FetchProgress, lag: float) -> None:
        stalled, silent = fetching.stalled(), fetching.silent()
        self.fetch_hooks(stalled)
        if stalled and not self._fetch_silent:
            log.warning("the fetch loop has not come round for %.0f s (a round lasts %g s at "
                        "most: the blocking wait, the call deadline and a retry's pause)%s: "
                        "this worker takes no task until it does", silent, fetching.limit,
                        ", the event loop blocked" if lag >= BLOCKED_AT_LEAST else "")
        if stalled:
            self._fetch_silent = max(self._fetch_silent, silent)
        elif self._fetch_silent:
            log.warning("the fetch loop comes round again after %.0f s or more",
                        self._fetch_silent)
            self._fetch_silent = 0.0

    def _warn(self, lag: float) -> None:
        frame = sys._current_frames().get(self.monitor.thread_id)
        stack = "".join(traceback.format_stack(frame, limit=STACK_FRAMES)) if frame else ""
        log.warning("the event loop has been blocked for %.1f s by %s: a handler calls "
                    "blocking code in an async def (await an asyncio call instead, or make "
                    "the handler a plain def, which runs in a thread); the heartbeat and "
                    "leases go on, but every other task of this worker waits. Where it "
                    "blocks:\n%s", lag, self.running() or "code outside any handler",
                    stack.rstrip())


# -- health, as the probes judge it ---------------------------------------------------------


@dataclass(frozen=True)
class WorkerHealth:
    """What the liveness and readiness probes judge by (read from any thread)."""

    started: bool
    draining: bool
    heartbeat_age: float = 0.0  # seconds since Redis last accepted a heartbeat
    redis_ok: bool = True  # the heartbeat's last call succeeded
    redis_answers: bool = True  # a heartbeat was answered within two intervals (False
    #                             while Redis hangs: no error, no answer either)
    loop_lag: float = 0.0  # how long the event loop has been blocked now (0: it runs)
    loop_limit: float = 60.0  # liveness fails once loop_lag passes this
    heartbeat_stalled: float = 0.0  # seconds the heartbeat thread has not come round
    #                                 (inf: it died); a Redis call under way is not counted
    fetch_silent: float = 0.0  # seconds since the fetch loop came round (0: not running)
    fetch_limit: float = math.inf  # the longest a round lasts (FetchProgress.limit)
    # Plain handlers that overran their timeout and still hold their slots, how
    # long the longest-stuck of them has been stuck (obsq/engine/pools), and the limits
    stuck_slots: int = 0
    stuck_seconds: float = 0.0
    stuck_limit: float = 300.0  # liveness fails once a slot has been stuck this long
    slots: int = 1  # readiness fails once this many are stuck


Check = Callable[[WorkerHealth], "str | None"]


def loop_blocked(h: WorkerHealth) -> str | None:
    if h.loop_lag > h.loop_limit:
        return (f"the event loop has been blocked for {h.loop_lag:.0f} s (limit "
                f"{h.loop_limit:g} s)")
    return None


def heartbeat_thread_stuck(h: WorkerHealth) -> str | None:
    if h.heartbeat_stalled == float("inf"):
        return "the heartbeat thread has died"
    if h.heartbeat_stalled > h.loop_limit:
        return f"the heartbeat thread has not come round for {h.heartbeat_stalled:.0f} s"
    return None


def fetch_loop_stalled(h: WorkerHealth) -> str | None:
    """Its every call has a deadline: a fetch loop that does not come round is stuck
    elsewhere (or the event loop is blocked), and the worker takes no task."""
    if h.fetch_silent > h.fetch_limit:
        return (f"the fetch loop has not come round for {h.fetch_silent:.0f} s (a round "
                f"lasts {h.fetch_limit:g} s at most)"
                + (": the event loop is blocked" if h.loop_lag >= BLOCKED_AT_LEAST else ""))
    return None


def fetch_loop_stuck(h: WorkerHealth) -> str | None:
    """Stalled for longer than the loop's blocking limit: only a restart frees it."""
    if h.fetch_silent > h.fetch_limit + h.loop_limit:
        return (f"the fetch loop has not come round for {h.fetch_silent:.0f} s (limit "
                f"{h.fetch_limit + h.loop_limit:g} s)")
    return None


def stuck_too_long(h: WorkerHealth) -> str | None:
    """A handler stuck past the limit will not return; only a restart frees it."""
    if h.stuck_slots and h.stuck_seconds > h.stuck_limit:
        return (f"{h.stuck_slots} slot(s) stuck in plain handlers that overran their "
                f"timeout, the longest for {h.stuck_seconds:.0f} s (limit {h.stuck_limit:g} s)")
    return None


def every_slot_stuck(h: WorkerHealth) -> str | None:
    """As many hung handlers as slots is a worker in trouble."""
    if h.stuck_slots >= h.slots:
        return f"every slot is stuck ({h.stuck_slots} plain handlers overran their timeout)"
    return None


def not_serving(h: WorkerHealth) -> str | None:
    if h.draining:
        return "the worker is draining"
    if not h.started:
        return "the worker is starting"
    return None


def redis_away(h: WorkerHealth) -> str | None:
    if not h.redis_ok:
        return "Redis is unreachable"
    if not h.redis_answers:
        return f"Redis has not answered for {h.heartbeat_age:.0f} s"
    return None


LIVENESS: list[Check] = [loop_blocked, heartbeat_thread_stuck, fetch_loop_stuck,
                         stuck_too_long]
READINESS: list[Check] = [not_serving, redis_away, every_slot_stuck, fetch_loop_stalled]


def first_problem(health: WorkerHealth, checks: list[Check]) -> str | None:
    """The reason of the first check that fails, or None."""
    for check in checks:
        problem = check(health)
        if problem is not None:
            return problem
    return None
