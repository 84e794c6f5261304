"""What keeps a worker's claims alive: its heartbeat (so the recoverer takes its tasks back
within seconds if it dies) and its leases (so a long task is not taken from a worker that is
still running it), on a thread of their own with a blocking Redis client of their own
(obsq/broker/keeping.py). A handler that blocks the event loop (a sync call in an
`async def`) therefore cannot make a live worker look lost, nor its tasks run twice.

The same thread renews the worker's event subscriptions after each heartbeat (a full Redis
refuses them, never the heartbeat), reads Redis's maxmemory-policy again now and then (a
change at run time to a policy that evicts is warned about, not refused: the running tasks
are better finished), and reads the namespace's data-set token with each heartbeat: a token
gone or changed means Redis lost its data (restarted without persistence, or flushed),
which is said as an error, once per loss; the heartbeat itself registers the queues and
subscriptions again, so the worker carries on. It also tells the worker whether its claims
were in doubt (a silence long enough for them to be taken over, such as a SIGSTOP), so
that a task fetched before it is checked in Redis before its handler starts."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from obsq.broker import Attempt
from obsq.broker.keeping import BlockingKeeping
from obsq.broker.startup import eviction_problem
from obsq.errors import BrokerError
from obsq.hooks import Hooks
from obsq.loop import RedisRetry
from obsq.settings import SAFE_MEMORY_POLICY

log = logging.getLogger("obsq")


class Claims:
    """The attempts a worker holds (buffered, running, or being settled), shared with its
    heartbeat thread. An attempt whose end is being recorded is `ending`: its lease is
    still extended, but a lease the extension finds gone was ended by the worker itself
    (the settle reached Redis first), not lost.

    Only the worker's event loop changes them, and the heartbeat thread only reads: each
    change is one dict or set operation, atomic under the GIL, and the thread iterates a
    copy made in one call, so no lock is taken (three per task cost a busy worker 3 µs of
    each task's CPU)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], int] = {}  # (queue, id) -> fence
        self._ending: set[tuple[str, str]] = set()

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

    def by_queue(self) -> dict[str, list[Attempt]]:
        attempts: dict[str, list[Attempt]] = {}
        for (queue, task_id), fence in self._held.copy().items():
            attempts.setdefault(queue, []).append(Attempt(task_id, fence))
        return attempts

    def really_lost(self, queue: str, ids: Sequence[str], sent: Sequence[Attempt]
                    ) -> list[str]:
        """Of the ids an extension found lost, those the worker still holds with the fence
        it sent and is not ending itself."""
        fences = {a.task_id: a.fence for a in sent}
        return [i for i in ids if (queue, i) not in self._ending
                and self._held.get((queue, i)) == fences.get(i)]


class Keeper:
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
        attempts = self.claims.by_queue()
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
