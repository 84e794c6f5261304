"""What a name may be. Queue names, task types, namespaces, task ids and schedule names
become parts of Redis keys: a queue name is a Redis Cluster hash tag, so braces would split
a queue across slots, and control characters would make keys unreadable in any tool; '#'
names a queue's partitions (obsq/partitions.py), so a queue's own name may not hold it. A
namespace starts every key, and `obsq acl` grants a user `~<namespace>:*`: a namespace
holding ':' (`shop:tenant2`) would live inside another's grant, and ACL glob characters
would widen it, so a namespace holds only letters, digits, '.', '_' and '-'."""

from __future__ import annotations

import functools
import logging
import re

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
