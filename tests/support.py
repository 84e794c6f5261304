"""Helpers for test modules (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

IN_CI = bool(os.environ.get("CI"))
# What the workers of the tests run with: a worker is known lost within seconds, and every
# sweep comes round several times a second (the defaults are for production).
SHORT_INTERVALS = {"heartbeat_interval": 0.5, "heartbeat_ttl": 3.0, "recover_interval": 0.1,
                   "janitor_interval": 0.5, "lock_ttl": 1.0, "wait_timeout": 0.5}


def short_interval_env() -> dict[str, str]:
    """SHORT_INTERVALS as the OBSQ_* variables of a worker process."""
    return {f"OBSQ_{name.upper()}": str(value) for name, value in SHORT_INTERVALS.items()}


def missing_tool(message: str) -> None:
    """Fail under CI (which installs every tool), skip on a developer's machine."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05,
             what: str = "condition") -> Any:
    """The blocking twin of wait_until, for fixtures: poll until truthy, fail after
    `timeout`. Exceptions of the condition count as not yet (a server still starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception as exc:
            value, error = None, exc
        else:
            error = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s"
                                 + (f" (last error: {error!r})" if error else ""))
        time.sleep(interval)


async def wait_until(condition: Callable[[], Any], timeout: float = 15.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `condition` (sync, or returning an awaitable) until it gives something truthy,
    and return that; an AssertionError it raises counts as not yet. Fail after `timeout`,
    saying what was awaited and the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            last = condition()
            if inspect.isawaitable(last):
                last = await last
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last: {last!r})")
        await asyncio.sleep(interval)


def redis_now_ms(raw_redis: Any) -> int:
    """Redis's clock, which decides every due time and lease (a sync redis-py client)."""
    seconds, micros = raw_redis.time()
    return seconds * 1000 + micros // 1000


async def depth(broker: Any, queue: str = "default") -> dict[str, int]:
    """Tasks of `queue` by state."""
    return (await broker.queue_stats([queue]))[queue].depth
