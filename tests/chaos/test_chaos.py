"""The short version of each chaos scenario (run.py runs the long ones): real Redis servers,
real worker processes, real faults; no acknowledged task may be lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import missing_tool

from .harness import libfaketime, redis_server_executable
from .scenarios import blocked_loop, failover, full, hang, redis_restart, skew, workers

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _redis_server() -> None:
    redis_server_executable()  # fails under CI, skips elsewhere, when there is none


async def test_workers_sigkilled_again_and_again_lose_nothing(tmp_path: Path) -> None:
    result, = await workers(2000, tmp_path, quick=True)
    assert result.lost == 0 and not result.notes["doctor"], result
    assert result.notes["kills"] >= 3
    assert result.notes["started_again_without_a_kill"] == 0
    assert result.recovery is not None


async def test_a_redis_restart_loses_nothing_with_appendfsync_always(tmp_path: Path) -> None:
    kept, reference = await redis_restart(800, tmp_path, quick=True, modes=("always", "no"))
    assert kept.lost == 0 and kept.recovery is not None and not kept.notes["doctor"], kept
    assert reference.lost > 0, reference  # a Redis that keeps nothing: the test sees losses


async def test_a_failover_loses_nothing_with_durable_replicas(tmp_path: Path) -> None:
    result, = await failover(1000, tmp_path, quick=True, durable=(1,))
    assert result.lost == 0 and not result.notes["doctor"], result
    assert result.recovery is not None, result  # tasks flow again after the promotion


async def test_a_frozen_redis_expires_no_lease_and_readyz_says_so(tmp_path: Path) -> None:
    result, = await hang(600, tmp_path, quick=True)
    assert result.lost == 0 and not result.notes["doctor"], result
    assert result.notes["started_again_without_a_kill"] == 0
    assert "Redis has not answered" in result.notes["readyz_during_the_freeze"]
    assert result.recovery is not None


async def test_a_full_redis_is_drained_and_takes_enqueues_again(tmp_path: Path) -> None:
    result, = await full(1000, tmp_path, quick=True)
    assert result.lost == 0 and not result.notes["doctor"], result
    assert "Redis is full" in result.notes["refusal"]
    assert result.enqueued == result.notes["queued_when_full"] + 1000
    assert result.recovery is not None


async def test_a_worker_with_a_skewed_clock(tmp_path: Path) -> None:
    if libfaketime() is None:
        missing_tool("libfaketime is not installed (Debian package faketime)")
    result, = await skew(1000, tmp_path, quick=True)
    assert result.lost == 0 and not result.notes["doctor"], result
    assert result.notes["started_by_the_skewed_worker_before_its_kill"] > 0
    assert result.notes["delayed_tasks_started_early"] == 0
    assert result.notes["started_again_without_a_kill"] == 0
    assert result.recovery is not None


async def test_a_handler_blocking_the_event_loop_makes_no_task_run_twice(tmp_path: Path) -> None:
    result, = await blocked_loop(1000, tmp_path, quick=True)
    assert result.lost == 0 and not result.notes["doctor"], result
    assert result.notes["started_again_without_a_kill"] == 0, result
    assert result.notes["timed_out"] == 0, result
    assert 0 < result.notes["blockings_logged"] <= result.notes["blocking_tasks"], result
