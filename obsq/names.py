"""What a name may be. Queue names, task types, namespaces, task ids and schedule names
become parts of Redis keys: a queue name is a Redis Cluster hash tag, so braces would split
a queue across slots, and control characters would make keys unreadable in any tool."""

from __future__ import annotations

import functools
import re

MAX_NAME_LENGTH = 200
_FORBIDDEN = re.compile(r"[{}\x00-\x1f]")
_SPACE = re.compile(r"\s")


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
    if kind in ("queue", "namespace", "schedule", "group", "event", "subscriber") and (
            _SPACE.search(value)):
        raise ValueError(f"{kind} {value!r} must not contain spaces")
    return value


def subscriber_task_type(event: str, subscriber: str) -> str:
    """The task type of an event's copies for one subscriber (its route in the App)."""
    return f"{event}@{subscriber}"
