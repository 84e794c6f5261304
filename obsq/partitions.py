"""One logical queue stored as several partitions (`app.queue("events", partitions=3)`).

A queue lives in one Redis Cluster hash slot, so on a Cluster it is bound to one master and
one core. A partitioned queue is N ordinary queues, each with every key and script of a
queue, named `<queue>#<i>/<n>.<salt>`: `#` may not appear in a queue's own name, so a
partition's name never collides with a queue's and always says which queue it belongs to.
The salt is the first number that puts partition i's hash slot near the middle of the i-th
of n equal slot ranges, the ranges a Cluster created with N masters gives its masters; so
the partitions spread over the masters instead of landing where CRC16 happens to put them.

Every guarantee stays per task because every task lives in one partition, chosen once by
the producer (`place`): by its ordering key (a key's tasks stay in one list, in order), its
unique key (one lock), its group (one batch), else by its id (a producer-chosen id is
refused as a duplicate within its partition, and a generated id spreads the tasks evenly).
"""

from __future__ import annotations

import binascii
import functools
import zlib

SEPARATOR = "#"
MAX_PARTITIONS = 256
CLUSTER_SLOTS = 16384


def check_partitions(count: object) -> int:
    """`count` if it is a valid number of partitions; else ValueError."""
    if not isinstance(count, int) or isinstance(count, bool) or not (
            1 <= count <= MAX_PARTITIONS):
        raise ValueError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got "
                         f"{count!r}")
    return count


@functools.lru_cache(maxsize=1024)
def partition_names(queue: str, count: int) -> tuple[str, ...]:
    """The names of a queue's `count` partitions, in order; a queue of one partition is
    the queue itself, under its own name."""
    if count == 1:
        return (queue,)
    return tuple(_partition_name(queue, i, count) for i in range(count))


def _partition_name(queue: str, index: int, count: int) -> str:
    middle = (index + 0.5) * CLUSTER_SLOTS / count
    reach = CLUSTER_SLOTS / (4 * count)  # within a quarter range of the middle: one master's
    salt = 0
    while True:
        name = f"{queue}{SEPARATOR}{index}/{count}.{salt}"
        if abs(hash_slot(name) - middle) <= reach:
            return name
        salt += 1


def hash_slot(tag: str) -> int:
    """The Redis Cluster slot of keys whose hash tag is `tag` (CRC16-XMODEM, as Redis)."""
    return binascii.crc_hqx(tag.encode(), 0) % CLUSTER_SLOTS


def stored_count(stored: bytes | str | None) -> int:
    """A partition count as Redis keeps it; 1 when there is none or it is not a count (a
    value written by hand must not stop producers)."""
    try:
        return check_partitions(int(stored)) if stored is not None else 1
    except ValueError:
        return 1


def queue_of(name: str) -> str:
    """The queue a partition belongs to (a queue's own name stays as it is)."""
    return name.partition(SEPARATOR)[0]


def partition_index(name: str) -> tuple[int, int] | None:
    """(index, count) of a partition's name; None for a queue's own name or a malformed
    one (a name typed by hand)."""
    _, separator, rest = name.partition(SEPARATOR)
    index, _, rest = rest.partition("/")
    count = rest.partition(".")[0]
    if not separator or not index.isdigit() or not count.isdigit():
        return None
    return int(index), int(count)


def count_in_name(name: str) -> int:
    """How many partitions the queue of a partition's name had: 1 for a queue's own name."""
    index = partition_index(name)
    return index[1] if index else 1


def is_partition_name(name: str) -> bool:
    """`name` is the name obsq gives one of a queue's partitions (a name typed by hand with
    another index, count or salt would make a partition no worker serves)."""
    index = partition_index(name)
    return index is not None and 1 < index[1] <= MAX_PARTITIONS and index[0] < index[1] \
        and name == partition_names(queue_of(name), index[1])[index[0]]


def choose(names: tuple[str, ...], key: str) -> str:
    """The partition of `names` that holds the tasks of `key` (crc32: the same on every
    producer, every run, every version of Python)."""
    if len(names) == 1:
        return names[0]
    return names[zlib.crc32(key.encode()) % len(names)]


def placement_key(task_id: str, ordering_key: str = "", unique_key: str = "",
                  group: str = "") -> str:
    """What decides a task's partition: what must stay in one place comes first."""
    if ordering_key:
        return "o:" + ordering_key
    if unique_key:
        return "u:" + unique_key
    return "g:" + group if group else task_id


def share(limit: int, count: int) -> int:
    """A route's concurrency limit as each of `count` partitions keeps it: at least 1, so
    no partition's tasks wait for good; at most limit + count - 1 run at once in all."""
    return max(1, -(-limit // count))
