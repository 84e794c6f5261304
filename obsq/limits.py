"""The route limits a worker applies when it takes tasks: the App's (`@app.task(...,
concurrency=3, rate_limit="100/s")`, counted in Redis across every worker) and its own
(`route_concurrency={"pdf:": 5}`, counted here). dequeue.lua checks them as it takes each
task and sets aside what may not start yet, so a limited route never takes a slot of the
worker nor blocks the routes behind it in the queue."""

from __future__ import annotations

from collections import Counter

import orjson

from obsq.app import App, PatternTable
from obsq.task import Task

# A cell-rate limit lets a start come early by this many intervals: a burst of two, so
# that the starts of any one-second window stay within the rate plus one.
RATE_TOLERANCE = 1.0


class RouteLimits:
    def __init__(self, app: App, route_concurrency: dict[str, int] | None) -> None:
        self._shared = [
            [r.pattern, r.concurrency or 0, 1000 / r.rate if r.rate else 0,
             RATE_TOLERANCE * 1000 / r.rate if r.rate else 0]
            for r in app.routes if r.concurrency or r.rate]
        self._own: PatternTable[str] = PatternTable()
        self._own_limits = dict(route_concurrency or {})
        for pattern in self._own_limits:
            self._own.add(pattern, pattern)
        self._taken: Counter[str] = Counter()  # this worker's attempts per own pattern

    def encoded(self) -> bytes:
        """What dequeue.lua takes: b"" when there is no limit at all (its fast path)."""
        if not self._shared and not self._own_limits:
            return b""
        own = [[p, limit - self._taken[p]] for p, limit in self._own_limits.items()]
        return orjson.dumps({"g": self._shared, "l": own})

    def took(self, task: Task) -> None:
        """A task this worker took (running, or waiting in its buffer) counts under its own
        limit until released."""
        pattern = self._own.match(task.type)
        if pattern is not None:
            self._taken[pattern] += 1
            task.context[_OWN_KEY] = pattern

    def released(self, task: Task) -> None:
        pattern = task.context.pop(_OWN_KEY, None)
        if pattern is not None:
            self._taken[pattern] -= 1


_OWN_KEY = "obsq.own_limit"
