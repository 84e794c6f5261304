"""The pools of plain handlers on their own (no Redis; the worker's use of both pools is
tests/engine/test_plain_overrun.py): a thread pool's timeout counts from the handler's
start, an overrunning handler keeps its thread (and its attempt the slot) and counts as
stuck until it returns; a process pool keeps its children, replaces one that overran or
died, and never holds more than its size; the settings that choose a pool and its stuck
limit; and the timeouts of awaited attempts (Deadlines: one timer per timeout length)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from obsq.app import Route
from obsq.broker.calls import Deadlines
from obsq.engine.pools.base import timed_out
from obsq.engine.pools.processes import ProcessSlots
from obsq.engine.pools.threads import ThreadSlots
from obsq.errors import ConfigurationError, HandlerCrashed, PayloadError, TaskTimeout
from obsq.settings import WorkerSettings
from obsq.task import Task
from tests.engine import pool_apps


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


async def test_an_overrunning_handler_keeps_its_thread_and_is_counted_until_it_returns():
    changes: list[int] = []
    pool = ThreadSlots(1, on_stuck=lambda: changes.append(pool.stuck().slots))
    gate = threading.Event()
    told: list[bool] = []
    overrunning = task(0.1)
    attempt = asyncio.ensure_future(pool.run(
        plain(lambda t: told.append(gate.wait(30) and t.cancelled)), overrunning))
    while not changes:
        await asyncio.sleep(0.01)
    assert pool.stuck().slots == 1 and changes == [1] and overrunning.cancelled
    # the one slot's thread is still the overrunning handler's: the next handler waits
    after = asyncio.ensure_future(pool.run(plain(lambda t: "ran"), task(5)))
    await asyncio.sleep(0.2)
    assert not attempt.done() and not after.done()
    gate.set()
    with pytest.raises(TaskTimeout, match=r"ran longer than its timeout of 0\.1 s"):
        await attempt  # only once its handler returned
    assert told == [True] and not overrunning.cancelled  # judged by its timeout, not cancelled
    assert await after == "ran"
    assert pool.stuck().slots == 0 and changes == [1, 0]
    assert sum(t.name.startswith("obsq-handler") for t in threading.enumerate()) == 1
    pool.close()


def test_a_pool_or_stuck_limit_that_cannot_be_is_refused_in_one_line():
    with pytest.raises(ConfigurationError, match="pool must be thread or process, got 'fork'"):
        WorkerSettings.from_env({"OBSQ_POOL": "fork"})
    with pytest.raises(ConfigurationError, match="stuck_limit must be positive, got 0"):
        WorkerSettings.from_env({"OBSQ_STUCK_LIMIT": "0"})
    assert WorkerSettings.from_env({"OBSQ_POOL": "process"}).pool == "process"


# -- the process pool's slots: children kept, replaced, never more than the size ----------


def pool_task(task_type: str, payload: object, timeout: float = 30) -> Task:
    return Task(id=task_type, type=task_type, queue="q", raw_payload=json.dumps(payload).encode(),
                raw_headers=b"", retry_count=0, max_retry=0, timeout=timeout, retention=0)


@pytest.fixture
def process_slots() -> Iterator[Callable[[int], ProcessSlots]]:
    made: list[ProcessSlots] = []

    def make(size: int) -> ProcessSlots:
        pool_apps.app.import_path = "tests.engine.pool_apps:app"
        made.append(ProcessSlots(size, pool_apps.app))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


async def nap(pool: ProcessSlots, seconds: float = 0, timeout: float = 30) -> int:
    return await pool.run(pool_apps.app.route("nap"), pool_task("nap", seconds, timeout))


async def test_process_slots_keep_their_children(process_slots) -> None:
    pool = process_slots(2)
    pids = [pid for _ in range(3)  # as a worker runs them: at most `size` at once
            for pid in await asyncio.gather(nap(pool, 0.05), nap(pool, 0.05))]
    assert len(set(pids)) == 2  # two children, each used for three tasks
    assert pool._live == 2 and len(pool._idle) == 2


async def test_a_child_reads_a_typed_payload_as_its_handlers_type(process_slots) -> None:
    pool, route = process_slots(1), pool_apps.app.route("typed:norm")
    assert await pool.run(route, pool_task("typed:norm", {"x": 3, "y": 4})) == 5.0
    with pytest.raises(PayloadError, match="Point misses 'y'"):
        await pool.run(route, pool_task("typed:norm", {"x": 3}))


async def settled(pool: ProcessSlots) -> ProcessSlots:
    """The pool once its replacements have started and its killed children are reaped."""
    while pool._background:
        await asyncio.gather(*pool._background)
    return pool


async def test_a_child_that_overran_is_killed_and_replaced_within_the_size(
        process_slots) -> None:
    pool = process_slots(1)
    first = await nap(pool)
    with pytest.raises(TaskTimeout):
        await nap(pool, 30, timeout=0.2)
    # a new child: the replacement, or one this attempt started while it was starting
    assert await nap(pool) != first
    await settled(pool)
    assert pool._live == 1 and len(pool._idle) == 1
    assert not await pid_alive(first)


async def test_a_child_that_died_by_itself_fails_only_its_attempt(process_slots) -> None:
    pool = process_slots(2)
    with pytest.raises(HandlerCrashed, match="exit status 3"):
        await pool.run(pool_apps.app.route("crash_quietly"), pool_task("crash_quietly", 0))
    pids = await asyncio.gather(nap(pool, 0.05), nap(pool, 0.05))
    assert len(set(pids)) == 2
    await settled(pool)
    assert pool._live == 2 and len(pool._idle) == 2


async def test_a_child_found_dead_while_idle_is_replaced_not_doubled(process_slots) -> None:
    pool = process_slots(2)
    first, second = await asyncio.gather(nap(pool, 0.05), nap(pool, 0.05))
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while all(child.alive for child in pool._idle) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the worker's loop hears of its death
    pids = await asyncio.gather(nap(pool, 0.05), nap(pool, 0.05))
    assert second in pids and first not in pids
    await settled(pool)
    assert pool._live == 2 and len(pool._idle) == 2


async def test_closed_process_slots_leave_no_child(process_slots) -> None:
    pool = process_slots(2)
    pids = await asyncio.gather(nap(pool, 0.05), nap(pool, 0.05))
    pool.close()
    assert not [pid for pid in pids if await pid_alive(pid)]


async def pid_alive(pid: int) -> bool:
    """Whether `pid` still runs (a killed child is reaped in the background: wait for it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_attempts_of_one_timeout_length_each_end_at_their_own_deadline():
    deadlines = Deadlines()

    async def attempt(start: float, runs: float) -> str:
        await asyncio.sleep(start)
        try:
            return await deadlines.run("t", asyncio.sleep(runs, "done"), 0.3, timed_out)
        except TaskTimeout:
            return "timed out"

    # one timer watches the three: the first's deadline passes while the second still has
    # time, and the third, started later, runs past the second's deadline but not its own
    assert await asyncio.gather(attempt(0, 0.6), attempt(0.1, 0.15), attempt(0.2, 0.25)
                                ) == ["timed out", "done", "done"]
    started = time.monotonic()
    with pytest.raises(TaskTimeout, match=r"ran longer than its timeout of 0\.2 s"):
        await deadlines.run("t", asyncio.sleep(5), 0.2, timed_out)
    assert 0.15 < time.monotonic() - started < 2


async def test_a_cancellation_from_outside_is_no_timeout_and_blocked_time_is_not_counted():
    blocked = [0.0]
    deadlines = Deadlines(lambda: blocked[0])
    outside = asyncio.ensure_future(deadlines.run("t", asyncio.sleep(5), 1, timed_out))
    await asyncio.sleep(0.05)
    outside.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outside

    async def loop_blocked_for_a_while() -> None:
        await asyncio.sleep(0.1)
        blocked[0] += 0.4  # as the LoopMonitor counts a blocked loop

    started = time.monotonic()
    blocking = asyncio.ensure_future(loop_blocked_for_a_while())
    with pytest.raises(TaskTimeout):
        await deadlines.run("t", asyncio.sleep(5), 0.2, timed_out)
    await blocking
    assert time.monotonic() - started >= 0.55  # 0.2 s, moved later by the 0.4 s blocked
    assert asyncio.current_task().cancelling() == 0  # the timeouts' own cancellations undone
