"""Helpers shared by the engine tests (fixtures live in conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import obsq
from obsq.broker import Broker, QueueKeys


def namespace_keys(r: Any, namespace: str) -> list[bytes]:
    """Every key of a namespace (a sync redis-py client)."""
    return list(r.scan_iter(match=f"{namespace}:*", count=1000))


async def live_worker_pids(broker: Broker) -> set[int]:
    return {w["pid"] for w in await broker.workers()}


def record_key(namespace: str, name: str) -> str:
    """A key written by the handlers of tests/engine/apps.py."""
    return f"{namespace}:rec:{name}"


def decoded(values: list[bytes]) -> list[str]:
    return [v.decode() for v in values]


def queue_key_names(skip_scripts: tuple[str, ...] = ()) -> set[str]:
    """What follows a queue's prefix in its keys: QueueKeys' names and those the scripts
    build ("prefix .. 'held:'"), but in the scripts named (another family's keys)."""
    queue = QueueKeys("ns", "q")
    names = {getattr(queue, n)[len(queue.prefix):] for n in QueueKeys.__slots__
             if n not in ("prefix", "queue")}
    names |= {"t:", "progress:", "inbox:", "unique:", "stats:"}
    for script in (Path(obsq.__file__).parent / "broker" / "scripts").glob("*.lua"):
        if script.name not in skip_scripts:
            names |= set(re.findall(r"prefix \.\. '([\w:-]+)'", script.read_text()))
    return names


def collides(name: str, taken: set[str]) -> bool:
    """The same key, or one family's keys ("held:...") among the other's."""
    return any(name == t or (t.endswith(":") and name.startswith(t))
               or (name.endswith(":") and t.startswith(name)) for t in taken)
