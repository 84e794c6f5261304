"""Helpers shared by the engine tests (fixtures live in conftest.py)."""

from __future__ import annotations

from typing import Any

from obsq.broker import Broker


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
