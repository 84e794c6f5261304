"""The queues a worker serves, as Redis keeps them: each queue's partitions (obsq/partitions.py)
by its App's count (`app.queue`), else by the count its other workers wrote to Redis; and the
partitions of an earlier count while they hold tasks, so a change of the count drains them.

Refreshed every REFRESH seconds: a producer that has not yet heard of a new count (or an old
version of the app) may still write to the earlier partitions, and they are served again as
soon as they hold tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from obsq.partitions import partition_names, queue_of

if TYPE_CHECKING:
    from obsq.broker import Broker

REFRESH = 10.0  # seconds between two looks at the partitions in Redis
LIVE_STATES = ("pending", "active", "scheduled", "retry", "aggregating")


class ServedQueues:
    def __init__(self, broker: Broker, weights: dict[str, int],
                 declared: dict[str, int]) -> None:
        """`weights`: the queues served and their weights; `declared`: the App's partition
        counts (app.partitions)."""
        self.broker = broker
        self.weights = weights
        self.declared = {q: n for q, n in declared.items() if q in weights}  # the App's
        # each queue's partitions served now, its current ones first
        self.partitions: dict[str, list[str]] = {q: [q] for q in weights}
        # every partition served, one list shared with the loops that read it at each pass
        self.names: list[str] = list(weights)

    async def refresh(self) -> None:
        """Look again (at start, then every REFRESH seconds). The App's counts reach Redis
        with each heartbeat (broker/upkeep.py)."""
        counts = dict(self.declared)
        undeclared = [q for q in self.weights if q not in counts]
        if undeclared:
            counts.update(await self.broker.partition_counts(undeclared))
        current = {q: list(partition_names(q, counts[q])) for q in self.weights}
        earlier = [name for name in await self.broker.queues() if queue_of(name) in current
                   and name not in current[queue_of(name)]]
        if earlier:
            stats = await self.broker.queue_stats(earlier)
            for name in earlier:
                if any(stats[name].depth[state] for state in LIVE_STATES):
                    current[queue_of(name)].append(name)
        self.partitions = current
        self.names[:] = [name for names in current.values() for name in names]

