"""What a name and a length of time may be.

Names: queue names, task types, namespaces, task ids and schedule names
become parts of Redis keys: a queue name is a Redis Cluster hash tag, so braces would split
a queue across slots, and control characters would make keys unreadable in any tool; '#'
names a queue's partitions (obsq/partitions.py), so a queue's own name may not hold it. A
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

import functools
import logging
import math
import re
from typing import Any

from obsq.errors import ConfigurationError
from obsq.partitions import SEPARATOR, is_partition_name

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
    if kind in ("queue", "schedule", "group", "event", "subscriber") and (
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
    """A time given as an option: a number of seconds obsq can keep (obsq/seconds.py),
    above 0 (or at least 0 with `zero`)."""
    if not is_seconds(value, zero=zero):
        raise ValueError(f"{name} must be {seconds_rule(zero)}, got {value!r}")


def duration(name: str, value: float | None, minimum: float = 0.001) -> float:
    """A length of time in seconds: 0 (or None) for none, else at least `minimum` (Redis
    counts expiries in whole milliseconds and refuses 0)."""
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
