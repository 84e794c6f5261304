"""Retries, backoff, SkipRetry, retry_in and timeouts. The times of retries are checked on a
clock the test steps (obsq.testing): exactly, and by moving it past the moment."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

import obsq
from obsq.engine.execution import default_backoff
from obsq.settings import BACKOFF_BASE, BACKOFF_CAP


def test_default_backoff_is_exponential_jittered_and_capped() -> None:
    for retry_count in range(0, 30):
        ceiling = min(BACKOFF_BASE * 2.0 ** retry_count, BACKOFF_CAP)
        samples = [default_backoff(retry_count) for _ in range(200)]
        assert all(ceiling * 0.5 <= s <= ceiling for s in samples), retry_count
        assert max(samples) - min(samples) > 0  # jittered, so retries do not stampede
    assert 1.0 <= default_backoff(0) <= 2.0
    assert default_backoff(100) <= BACKOFF_CAP


async def test_a_failing_task_is_retried_with_backoff_then_dead_with_counts_and_error(
        app, start_env) -> None:
    attempts: list[tuple[int, float]] = []

    @app.task("flaky")
    async def flaky(task: obsq.Task):
        attempts.append((task.retry_count, env.clock.time()))
        raise ValueError(f"attempt {task.retry_count} failed")

    env = await start_env()
    client = env.client
    info = await client.enqueue("flaky", max_retry=3, retention=3600)
    await env.advance(3600)
    with pytest.raises(obsq.TaskFailed) as caught:
        await client.result(info, timeout=10)
    assert caught.value.error == "ValueError: attempt 3 failed"
    assert [count for count, _ in attempts] == [0, 1, 2, 3]
    for (count, at), (_, then) in itertools.pairwise(attempts):  # the default backoff
        ceiling = min(BACKOFF_BASE * 2.0 ** count, BACKOFF_CAP)
        assert ceiling / 2 <= then - at <= ceiling, count
    dead = await client.info(info.id)
    assert dead.state == "dead"
    assert dead.retry_count == 3
    assert dead.error == "ValueError: attempt 3 failed"
    assert dead.completed_at is not None


async def test_retry_then_success_completes(app, client, start_worker) -> None:
    @app.task("second-time-lucky", retry_delay=0)
    async def lucky(task: obsq.Task):
        if task.retry_count == 0:
            raise ConnectionError("transient")
        return "ok"

    await start_worker()
    info = await client.enqueue("second-time-lucky", retention=60)
    assert await client.result(info, timeout=10) == "ok"
    done = await client.info(info.id)
    assert (done.state, done.retry_count) == ("completed", 1)


async def test_retry_delay_as_a_number_schedules_the_retry(app, start_env) -> None:
    failed_at: list[float] = []

    @app.task("later", retry_delay=30)
    async def later(task: obsq.Task):
        failed_at.append(env.clock.time())
        raise RuntimeError("not yet")

    env = await start_env()
    info = await env.client.enqueue("later")
    await env.drain()
    retrying = await env.client.info(info.id)
    assert (retrying.state, retrying.retry_count) == ("retry", 1)
    assert retrying.error == "RuntimeError: not yet"
    assert retrying.next_run_at.timestamp() == failed_at[0] + 30
    await env.advance(29.999)
    assert len(failed_at) == 1  # not a millisecond early
    await env.advance(0.001)
    assert failed_at[1] == failed_at[0] + 30


async def test_retry_delay_function_gets_count_exception_and_task(app, start_env) -> None:
    calls: list[tuple[int, str, str]] = []

    def policy(retry_count: int, exc: BaseException, task: obsq.Task) -> float:
        calls.append((retry_count, repr(exc), task.id))
        return 10.0 * (retry_count + 1)

    @app.task("policy", retry_delay=policy)
    async def handler(task: obsq.Task):
        failed_at.append(env.clock.time())
        raise KeyError(task.retry_count)

    failed_at: list[float] = []
    env = await start_env()
    info = await env.client.enqueue("policy", max_retry=2, retention=3600)
    await env.advance(30)
    with pytest.raises(obsq.TaskFailed):
        await env.client.result(info, timeout=10)
    assert [b - a for a, b in itertools.pairwise(failed_at)] == [10, 20]  # as it said
    # called for each failure that is retried, not for the last one
    assert calls == [(0, "KeyError(0)", info.id), (1, "KeyError(1)", info.id)]


async def test_a_broken_retry_delay_function_falls_back_to_the_default(app, start_env) -> None:
    @app.task("broken-policy", retry_delay=lambda n, exc, task: 1 / 0)
    async def handler(task: obsq.Task):
        raise RuntimeError("fail")

    env = await start_env()
    info = await env.client.enqueue("broken-policy")
    await env.drain()
    retrying = await env.client.info(info.id)
    assert retrying.state == "retry"
    assert 1 <= retrying.next_run_at.timestamp() - env.clock.time() <= 2  # the default


async def test_skip_retry_goes_straight_to_dead(app, client, start_worker) -> None:
    attempts: list[int] = []

    @app.task("hopeless")
    async def hopeless(task: obsq.Task):
        attempts.append(task.retry_count)
        raise obsq.SkipRetry("the account does not exist")

    await start_worker()
    info = await client.enqueue("hopeless", max_retry=25, retention=60)
    with pytest.raises(obsq.TaskFailed, match="the account does not exist"):
        await client.result(info, timeout=10)
    assert attempts == [0]
    dead = await client.info(info.id)
    assert (dead.state, dead.retry_count) == ("dead", 0)


async def test_retry_in_reschedules_the_task(app, start_env, caplog) -> None:
    @app.task("poll")
    async def poll(task: obsq.Task):
        await task.retry_in(60)

    caplog.set_level(logging.INFO, logger="obsq")
    env = await start_env()
    info = await env.client.enqueue("poll", max_retry=5)
    await env.drain()
    retrying = await env.client.info(info.id)
    assert (retrying.state, retrying.retry_count) == ("retry", 1)
    assert retrying.next_run_at.timestamp() == env.clock.time() + 60
    assert "retry requested in 60 s" in retrying.error
    logged = [r for r in caplog.records if info.id in r.getMessage()]
    assert [(r.levelname, r.getMessage().split(": ")[0]) for r in logged] == [
        ("INFO", f"task {info.id} (poll) asked to run again in 60.0 s")]  # no failure


async def test_retry_in_runs_the_task_again(app, start_env) -> None:
    runs: list[tuple[int, float]] = []

    @app.task("poll")
    async def poll(task: obsq.Task):
        runs.append((task.retry_count, env.clock.time()))
        if len(runs) < 3:
            task.retry_in(600)
        return len(runs)

    env = await start_env()
    start = env.clock.time()
    info = await env.client.enqueue("poll", retention=3600)
    await env.advance(1199)
    assert len(runs) == 2  # the third run is due at 1,200 s
    await env.advance(1)
    assert await env.client.result(info, timeout=10) == 3
    assert runs == [(0, start), (1, start + 600), (2, start + 1200)]


async def test_retry_in_with_a_negative_delay_is_an_error(app, client, start_worker) -> None:
    @app.task("neg")
    async def neg(task: obsq.Task):
        task.retry_in(-1)

    await start_worker()
    info = await client.enqueue("neg", max_retry=0, retention=60)
    with pytest.raises(obsq.TaskFailed, match="ValueError"):
        await client.result(info, timeout=10)


async def test_a_handler_past_its_timeout_fails_with_task_timeout_and_is_retried(
        app, client, start_worker) -> None:
    cancelled: list[int] = []

    @app.task("sleepy", timeout=0.2, retry_delay=0)
    async def sleepy(task: obsq.Task):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(task.retry_count)
            raise

    await start_worker()
    info = await client.enqueue("sleepy", max_retry=1, retention=60)
    with pytest.raises(obsq.TaskFailed) as caught:
        await client.result(info, timeout=10)
    assert caught.value.error == ("TaskTimeout: the handler ran longer than its timeout "
                                  "of 0.2 s")
    assert cancelled == [0, 1]  # timed out, retried, timed out again
    dead = await client.info(info.id)
    assert (dead.state, dead.retry_count) == ("dead", 1)

