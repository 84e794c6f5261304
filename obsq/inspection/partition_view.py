"""What an operator sees of a partitioned queue (obsq/names.py): one queue, whatever
the number of queues Redis stores it as. The namespace's registry lists each partition as a
queue of its own; here they are put back under their queue's name, with those of an earlier
count still registered (workers drain them), and their figures summed; its count is the
one its workers declared.

A page of a partitioned queue (tasks of a state, groups, batches) lists its partitions one
after another, each in its own order (a state's order holds within a partition, not across
them), and its offset counts across them, so it stays a plain number and a page stays
bounded: after one count of each partition, a page reads only the partitions its window
covers. As in one queue, tasks that move between two pages may shift the next by as many.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Protocol, TypeVar

from obsq.broker import QueueStats
from obsq.inspection.inspected import PartitionInfo, QueueInfo, Rate
from obsq.names import SEPARATOR, partition_index, queue_of
from obsq.settings import TOP_FAIRNESS_KEYS

Row = TypeVar("Row")
# read(partition's position, offset in it, rows wanted, positions it may look at)
#   -> (rows, its next offset or None after its last)
Read = Callable[[int, int, int, int], Awaitable[tuple[list[Row], "int | None"]]]


def partitions_of(registered: Iterable[str]) -> dict[str, list[str]]:
    """{queue: the registered queues that store it}, by queue name; a queue stored as
    itself alone maps to [itself]. Partitions come by count, then index (the queue's own
    name first: a count of one)."""
    grouped: dict[str, list[str]] = {}
    for name in registered:
        grouped.setdefault(queue_of(name), []).append(name)
    return {queue: sorted(names, key=_position) for queue, names in sorted(grouped.items())}


def resolve(name: str, registered: Collection[str]) -> list[str]:
    """The registered queues `name` addresses: a partition's name, that partition alone; a
    queue's name, all that store it. [] when none is registered."""
    if SEPARATOR in name:
        return [name] if name in registered else []
    return partitions_of(q for q in registered if queue_of(q) == name).get(name, [])


def readable(name: str) -> str:
    """A partition's name as a person reads it: its queue first."""
    index = partition_index(name)
    return f"{queue_of(name)} (partition {index[0]}/{index[1]}: {name})" if index else name


class Figures(Protocol):
    """A partition's figures, only read: a QueueStats (a NamedTuple) or a QueueInfo."""

    @property
    def depth(self) -> dict[str, int]: ...

    @property
    def latency(self) -> float: ...

    @property
    def paused(self) -> bool: ...

    @property
    def keys_waiting(self) -> int: ...

    @property
    def top_keys(self) -> Sequence[tuple[str, int]]: ...


def summed(parts: Sequence[Figures]) -> QueueStats:
    """A queue's figures from its partitions': depths summed, the longest latency, paused
    when every partition is (no worker takes its tasks; when only some are, the queue is
    still served, and autoscaling and latency alerts must go on counting it); the fairness
    keys with waiting tasks summed (a key waiting in two partitions counts twice), and the
    top keys of the partitions merged."""
    if len(parts) == 1:
        return QueueStats(parts[0].depth, parts[0].latency, parts[0].paused,
                          parts[0].keys_waiting, tuple(parts[0].top_keys))
    top: Counter[str] = Counter()
    for p in parts:
        top.update(dict(p.top_keys))
    return QueueStats({state: sum(p.depth[state] for p in parts) for state in parts[0].depth},
                      max(p.latency for p in parts), all(p.paused for p in parts),
                      sum(p.keys_waiting for p in parts),
                      tuple(top.most_common(TOP_FAIRNESS_KEYS)))


def combined(name: str, parts: Sequence[QueueInfo], declared: int = 1) -> QueueInfo:
    """The QueueInfo of a queue stored as `parts` (summed), runs and failures summed.

    Its partition count is `declared` (what its workers declared), or, while none of those
    partitions is registered (no worker has declared a count yet), the highest registered.
    A partition of another count is kept in the registry for good, so the breakdown lists
    it only while it holds tasks in any state (dead and completed ones too: they are still
    the operator's to read, requeue or purge there), marked `earlier`; every partition's
    figures count in the sums."""
    if [p.name for p in parts] == [name]:
        return parts[0]
    found = [PartitionInfo(p.name, *(partition_index(p.name) or (0, 1)), p.depth, p.latency,
                           p.paused, p.last_minute, p.last_hour) for p in parts]
    count = declared if any(p.count == declared for p in found) else max(
        p.count for p in found)
    for p in found:
        p.earlier = p.count != count
    figures = summed(parts)
    return QueueInfo(
        name, figures.depth, figures.latency, figures.paused, _sum(p.last_minute for p in parts),
        _sum(p.last_hour for p in parts),
        [_sum(minute) for minute in zip(*(p.per_minute for p in parts))],
        [p for p in found if not p.earlier or p.size], count, figures.keys_waiting,
        list(figures.top_keys))


async def across(sizes: Sequence[int], offset: int, limit: int, read: Read[Row],
                 budget: int) -> tuple[list[Row], int | None]:
    """A page of `limit` rows from `offset` over partitions of `sizes` rows, and the offset
    of the next page (None after the last); the partitions read together look at no more
    than `budget` positions (a type filter's cap)."""
    rows: list[Row] = []
    start, end = 0, sum(sizes)
    for position, size in enumerate(sizes):
        if offset >= start + size:
            start += size
            continue
        local = max(offset - start, 0)
        found, local_next = await read(position, local, limit - len(rows), budget)
        rows += found
        if local_next is not None:  # this partition goes on: so does the next page
            return rows, start + local_next
        budget -= size - local
        start += size
        if len(rows) >= limit or budget <= 0:
            return rows, start if start < end else None
    return rows, None


def _position(name: str) -> tuple[int, int, str]:
    index, count = partition_index(name) or (0, 1)
    return count, index, name


def _sum(rates: Iterable[Rate]) -> Rate:
    processed = failed = 0
    for rate in rates:
        processed, failed = processed + rate.processed, failed + rate.failed
    return Rate(processed, failed)
