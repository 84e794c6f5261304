"""What a name and a length of time may be, and the names of a partitioned queue's
partitions.

Names: queue names, task types, namespaces, task ids and schedule names
become parts of Redis keys: a queue name is a Redis Cluster hash tag, so braces would split
a queue across slots, and control characters would make keys unreadable in any tool; '#'
names a queue's partitions (below), so a queue's own name may not hold it. A
namespace starts every key, and `obsq acl` grants a user `~<namespace>:*`: a namespace
holding ':' (`shop:tenant2`) would live inside another's grant, and ACL glob characters
would widen it, so a namespace holds only letters, digits, '.', '_' and '-'.

Times: every time obsq is given (a setting, a task option, a deadline) becomes milliseconds
on Redis's clock, kept in sorted-set scores and compared in Lua, whose numbers hold whole
milliseconds exactly only up to 2**53. `inf` would be a time that never comes and `nan` one
that never compares; a huge finite number (1e16 seconds) loses its precision there, so a
lease of that length expired at once and its task ran twice. So a time is a real number no
longer than LONGEST_SECONDS."""

from __future__ import annotations

import binascii
import functools
import logging
import math
import re
import zlib
from datetime import timedelta
from typing import Any

from obsq.errors import ConfigurationError

MAX_NAME_LENGTH = 200
_FORBIDDEN = re.compile(r"[{}\x00-\x1f]")
_SPACE = re.compile(r"\s")
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]+")


def validate_name(kind: str, value: str) -> str:
    """`value` if it is a valid `kind` ("queue", "task type", ...); else ValueError."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    return _checked_name(kind, value)


@functools.lru_cache(maxsize=4096)  # the same few types and queues, checked per enqueue
def _checked_name(kind: str, value: str) -> str:
    if len(value) > MAX_NAME_LENGTH or _FORBIDDEN.search(value):
        raise ValueError(f"{kind} {value!r} must be at most {MAX_NAME_LENGTH} characters "
                         "without braces or control characters")
    if kind in ("queue", "schedule", "group", "event", "subscriber", "debounce_key") and (
            _SPACE.search(value)):
        raise ValueError(f"{kind} {value!r} must not contain spaces")
    if kind == "queue" and SEPARATOR in value and not is_partition_name(value):
        raise ValueError(f"queue {value!r} must not contain {SEPARATOR!r}, which names a "
                         "queue's partitions (<queue>#<i>/<n>.<salt>, as obsq names them)")
    return value


def validate_namespace(value: str) -> str:
    """`value` if it is a valid namespace; else ConfigurationError."""
    if not isinstance(value, str) or not _NAMESPACE.fullmatch(value) or (
            len(value) > MAX_NAME_LENGTH):
        raise ConfigurationError(
            f"namespace {value!r} must be 1 to {MAX_NAME_LENGTH} letters, digits, '.', '_' "
            "or '-' (it starts every Redis key, and the ACL rule of `obsq acl` grants "
            "<namespace>:*: a ':' would put it inside another namespace's grant)")
    return value


def warn_if_not_the_apps(who: str, namespace: str, app_namespace: str) -> None:
    """A worker or scheduler told another namespace than its App's (--namespace,
    OBSQ_NAMESPACE) serves keys that no Client built with the App writes to: its tasks would
    wait for good, silently, unless this is said at start."""
    if namespace != app_namespace:
        logging.getLogger("obsq").warning(
            "%s serves namespace %r (--namespace or OBSQ_NAMESPACE), not its App's %r: "
            "producers using this App (obsq.Client(url, app=app)) write to %r, where this "
            "%s does not look; give both the same namespace", who, namespace, app_namespace,
            app_namespace, who)


def subscriber_task_type(event: str, subscriber: str) -> str:
    """The task type of an event's copies for one subscriber (its route in the App)."""
    return f"{event}@{subscriber}"


LONGEST_SECONDS = 10 * 365 * 24 * 3600.0  # ten years: beyond anything obsq waits for
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def is_seconds(value: Any, *, zero: bool = False) -> bool:
    """Whether `value` is a number of seconds obsq can keep: above 0 (at least 0 with
    `zero`), finite and at most LONGEST_SECONDS; a bool is not a number here."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and (value >= 0 if zero else value > 0)
            and value <= LONGEST_SECONDS)


def seconds_rule(zero: bool = False) -> str:
    """How `is_seconds` is worded in an error: 'a positive number of seconds of at most ...'."""
    return (f"a {'non-negative' if zero else 'positive'} number of seconds of at most "
            f"{LONGEST_SECONDS:.0f} (ten years)")


def check_seconds(name: str, value: Any, *, zero: bool = False) -> None:
    """A time given as an option: a number of seconds obsq can keep (obsq/names.py),
    above 0 (or at least 0 with `zero`)."""
    if not is_seconds(value, zero=zero):
        raise ValueError(f"{name} must be {seconds_rule(zero)}, got {value!r}")


def duration(name: str, value: float | timedelta | None, minimum: float = 0.001) -> float:
    """A length of time in seconds (or a timedelta): 0 (or None) for none, else at least
    `minimum` (Redis counts expiries in whole milliseconds and refuses 0)."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if value is None or value == 0:
        return 0.0
    if not (is_seconds(value) and value >= minimum):
        raise ValueError(f"{name} must be 0 or a number of seconds of at least {minimum:g} "
                         f"and at most {LONGEST_SECONDS:.0f} (ten years), got {value!r}")
    return float(value)


def parse_rate(rate: str) -> float:
    """'100/s' (or '/m', '/h') -> starts per second."""
    count, _, unit = str(rate).partition("/")
    try:
        per_second = float(count) / RATE_UNITS[unit.strip()]
    except (ValueError, KeyError):
        raise ValueError(f"rate_limit {rate!r} is not like '100/s', '30/m' or '5/h'") from None
    if not (per_second > 0 and math.isfinite(per_second)):
        raise ValueError(f"rate_limit {rate!r} must be a positive rate")
    return per_second


# -- partitions ------------------------------------------------------------------------------
# One logical queue stored as several partitions (`app.queue("events", partitions=3)`). A
# queue lives in one Redis Cluster hash slot, so on a Cluster it is bound to one master and
# one core. A partitioned queue is N ordinary queues, each with every key and script of a
# queue, named `<queue>#<i>/<n>.<salt>`: `#` may not appear in a queue's own name, so a
# partition's name never collides with a queue's and always says which queue it belongs
# to. The salt is the first number that puts partition i's hash slot near the middle of the
# i-th of n equal slot ranges, the ranges a Cluster created with N masters gives its
# masters; so the partitions spread over the masters instead of landing where CRC16 puts
# them. Every guarantee stays per task because every task lives in one partition, chosen
# once by the producer (`place`): by its ordering key (a key's tasks stay in one list, in
# order), its unique key (one lock), its group (one batch), else by its id.

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
                  group: str = "", debounce: str = "") -> str:
    """What decides a task's partition: what must stay in one place comes first.
    `group` and `debounce` are "<type> <group or debounce key>"."""
    if ordering_key:
        return "o:" + ordering_key
    if unique_key:
        return "u:" + unique_key
    if debounce:
        return "d:" + debounce
    return "g:" + group if group else task_id


def share(limit: int, count: int) -> int:
    """A route's concurrency limit as each of `count` partitions keeps it: at least 1, so
    no partition's tasks wait for good; at most limit + count - 1 run at once in all."""
    return max(1, -(-limit // count))
