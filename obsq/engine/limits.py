"""The route limits a worker applies when it takes tasks: the App's (`@app.task(...,
concurrency=3, rate_limit="100/s")`, counted in Redis across every worker) and its own
(`route_concurrency={"pdf:": 5}`, counted here). dequeue.lua checks them as it takes each
task and sets aside what may not start yet, so a limited route never takes a slot of the
worker nor blocks the routes behind it in the queue."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from obsq.app import App, PatternTable
from obsq.partitions import share
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
        self._by_count: dict[int, list[list[Any]]] = {}  # the shares per partition count

    def encoded(self, partitions: int = 1) -> bytes:
        """What dequeue.lua takes for a queue of `partitions` partitions: b"" when there is
        no limit at all (its fast path). Each partition keeps its share of the App's limits
        (counted in its own keys): a concurrency limit C as ceil(C/N), at least 1, so at most
        C + N - 1 run at once; a rate as rate/N, the whole rate while the route's tasks
        spread over the partitions. The worker's own limits are its own, whole."""
        if not self._shared and not self._own_limits:
            return b""
        own = [[p, limit - self._taken[p]] for p, limit in self._own_limits.items()]
        return orjson.dumps({"g": self._shares(partitions), "l": own})

    def _shares(self, partitions: int) -> list[list[Any]]:
        if partitions == 1:
            return self._shared
        shares = self._by_count.get(partitions)
        if shares is None:
            shares = self._by_count[partitions] = [
                [pattern, share(limit, partitions) if limit else 0, interval * partitions,
                 tolerance * partitions] for pattern, limit, interval, tolerance in self._shared]
        return shares

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
