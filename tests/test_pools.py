"""The thread pool of plain handlers on its own (no Redis; the worker's use of both pools is
tests/engine/test_plain_overrun.py): a timeout counts from the handler's start, an
overrunning handler's thread is replaced and counted as stuck until it returns; and the
settings that choose a pool and its stuck limit."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from obsq.app import Route
from obsq.errors import ConfigurationError, TaskTimeout
from obsq.pools.threads import ThreadSlots
from obsq.settings import WorkerSettings
from obsq.task import Task


def plain(handler) -> Route:
    return Route("t", handler, is_async=False)


def task(timeout: float) -> Task:
    return Task(id="i", type="t", queue="q", raw_payload=b"null", raw_headers=b"",
                retry_count=0, max_retry=0, timeout=timeout, retention=0)


async def test_a_timeout_counts_from_the_handlers_start_not_its_wait_for_a_thread():
    pool = ThreadSlots(1, on_stuck=lambda: None)
    first = asyncio.ensure_future(pool.run(plain(lambda t: time.sleep(0.6)), task(5)))
    await asyncio.sleep(0.05)
    # waits 0.55 s for the one thread, then runs 0.2 s: 0.75 s after submission, within
    # its 0.4 s from its start
    assert await pool.run(plain(lambda t: time.sleep(0.2) or "done"), task(0.4)) == "done"
    await first
    pool.close()


async def test_an_overrunning_handler_is_replaced_and_counted_until_it_returns():
    changes: list[int] = []
    pool = ThreadSlots(1, on_stuck=lambda: changes.append(pool.stuck().slots))
    gate = threading.Event()
    with pytest.raises(TaskTimeout, match=r"ran longer than its timeout of 0\.1 s"):
        await pool.run(plain(lambda t: gate.wait(30)), task(0.1))
    assert pool.stuck().slots == 1 and changes == [1]
    # the one slot has a fresh thread: the next handler runs at once
    assert await pool.run(plain(lambda t: threading.current_thread().name), task(5))
    gate.set()
    deadline = time.monotonic() + 10
    while pool.stuck().slots and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert pool.stuck().slots == 0 and changes == [1, 0]
    pool.close()


def test_a_pool_or_stuck_limit_that_cannot_be_is_refused_in_one_line():
    with pytest.raises(ConfigurationError, match="pool must be thread or process, got 'fork'"):
        WorkerSettings.from_env({"OBSQ_POOL": "fork"})
    with pytest.raises(ConfigurationError, match="stuck_limit must be positive, got 0"):
        WorkerSettings.from_env({"OBSQ_STUCK_LIMIT": "0"})
    assert WorkerSettings.from_env({"OBSQ_POOL": "process"}).pool == "process"
