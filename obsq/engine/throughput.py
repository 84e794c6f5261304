"""Throughput and failure counts per queue, kept in Redis for the Inspector and the console.

Each worker counts the outcomes of its attempts in memory through the public outcome hook
(`app.on_outcome`) and adds them every second to per-minute buckets in Redis (one
small hash per queue and minute, on the server's clock, expiring after a little over an
hour): a few HINCRBYs per queue every THROUGHPUT_FLUSH_INTERVAL, whatever the task rate.
"""

from __future__ import annotations

import logging
from collections import Counter

from obsq.app import App
from obsq.background import BackgroundLoop
from obsq.broker import Broker
from obsq.settings import THROUGHPUT_BUCKET_TTL, THROUGHPUT_FLUSH_INTERVAL
from obsq.task import Task

log = logging.getLogger("obsq")



class ThroughputCounter(BackgroundLoop):
    """Counts the outcomes of one worker's attempts and flushes them to Redis. Registers
    its hook on start and removes it on stop, after a last flush."""

    name = "throughput"

    def __init__(self, app: App, broker: Broker,
                 interval: float = THROUGHPUT_FLUSH_INTERVAL) -> None:
        super().__init__(interval)
        self.app = app
        self.broker = broker
        self._counts: dict[str, Counter[str]] = {}

    def record(self, task: Task, outcome: str, error: BaseException | None) -> None:
        """The outcome hook: counts in memory only, so it costs nothing on the hot path."""
        if task._attempt.counted:
            return
        task._attempt.counted = True
        counts = self._counts.get(task.kept_in)
        if counts is None:  # not setdefault: a Counter made per task costs it half a µs
            counts = self._counts[task.kept_in] = Counter()
        counts[outcome] += 1

    async def tick(self) -> None:
        counts, self._counts = self._counts, {}
        if not counts:
            return
        try:
            await self.broker.tally(counts, THROUGHPUT_BUCKET_TTL)
        except BaseException:
            for queue, by_outcome in counts.items():  # kept for the next flush
                self._counts.setdefault(queue, Counter()).update(by_outcome)
            raise

    def start(self) -> None:
        self.app.on_outcome(self.record)
        super().start()

    async def stop(self) -> None:
        await super().stop()
        if self.record in self.app.outcome_hooks:
            self.app.outcome_hooks.remove(self.record)
        try:
            await self.tick()
        except Exception as exc:
            log.warning("throughput counts of the last seconds were not saved: %s", exc)
