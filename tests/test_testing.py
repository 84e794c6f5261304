"""obsq.testing and its pytest plugin: the guide's example (examples/testing: test_tasks.py,
the shop it tests and its conftest) passes as a user runs it (pytest on their project, the
plugin loaded by its entry point), and the Environment steps the clock through what the
example does not show (a lease that ends, a usage error)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from importlib.metadata import entry_points

import pytest
from support import ROOT

import obsq
from obsq.broker import Broker
from obsq.testing import Environment

EXAMPLE = ROOT / "examples" / "testing"


def run_pytest(*args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a process of its own, from the repository's root, with obsq's plugin (by its
    entry point once obsq is installed with it, else named)."""
    installed = any(e.value == "obsq.pytest_plugin" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "obsq.pytest_plugin"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *plugin, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_example_test_file_passes() -> None:
    started = time.perf_counter()
    result = run_pytest(str(EXAMPLE / "test_tasks.py"), "--durations=0")
    print(f"\nexamples/testing/test_tasks.py: {time.perf_counter() - started:.2f} s of wall "
          f"time\n{result.stdout[-1500:]}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout


def test_the_plugin_loads_nothing_of_obsq_until_a_test_asks_for_its_fixtures() -> None:
    """pytest loads the plugin into every test run of a project that installs obsq."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, obsq.pytest_plugin; print(sorted(m for m in "
         "sys.modules if m.startswith(('obsq', 'redis', 'opentelemetry'))))"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=60)
    assert loaded.stdout.strip() == "['obsq', 'obsq._version', 'obsq.pytest_plugin']", (
        loaded.stderr)


def test_without_an_app_the_fixture_says_how_to_give_one(tmp_path) -> None:
    (tmp_path / "test_x.py").write_text("async def test_x(obsq_env):\n    pass\n")
    result = run_pytest(str(tmp_path / "test_x.py"), "--rootdir", str(tmp_path))
    assert result.returncode != 0
    assert "define a fixture named obsq_app" in result.stdout + result.stderr


app = obsq.App()


@app.task("job")
async def job(task: obsq.Task) -> None:
    pass


async def test_an_attempt_whose_lease_ends_is_taken_back_once_the_clock_passes_it(
        redis_url: str, namespace: str) -> None:
    # the environment's worker serves another queue: the task is left to a worker elsewhere
    async with Environment(app, redis_url=redis_url, namespace=namespace,
                           queues={"other": 1}) as env:
        info = await env.client.enqueue("job", retention=3600)
        elsewhere = Broker(redis_url, namespace, clock=env.clock)
        try:
            _, fetched = await elsewhere.dequeue("default", 1, "elsewhere", 30)
        finally:
            await elsewhere.close()
        assert [t.id for t in fetched.tasks] == [info.id]
        await env.advance(29.999)
        assert (await env.client.info(info.id)).state == "active"  # its lease holds
        await env.advance(0.001)
        assert (await env.client.info(info.id)).state == "pending"  # taken back at its end


async def test_a_chain_steps_on_as_the_clock_moves(redis_url: str, namespace: str) -> None:
    steps = obsq.App()
    seen: list[tuple[str, object]] = []

    @steps.task("fetch")
    async def fetch(task: obsq.Task) -> int:
        seen.append(("fetch", task.payload))
        return 41

    @steps.task("wait-for-bank")
    async def wait_for_bank(task: obsq.Task) -> int:
        seen.append(("bank", task.retry_count))
        if task.retry_count == 0:
            task.retry_in(60)
        return task.previous + 1

    async with Environment(steps, redis_url=redis_url, namespace=namespace) as env:
        info = await env.client.enqueue(obsq.chain(obsq.Job("fetch", "x"),
                                                   obsq.Job("wait-for-bank")))
        await env.drain()
        assert seen == [("fetch", "x"), ("bank", 0)]  # the second step ran once, at once
        await env.advance(59.999)
        assert len(seen) == 2
        await env.advance(0.001)
        assert await env.client.result(info, timeout=5) == 42
        assert seen[-1] == ("bank", 1)


async def test_a_frequent_schedule_logs_its_first_fire_and_an_hourly_count_at_info(
        redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each fire at DEBUG: an `@every 5s` entry wrote 17,000 INFO lines a day."""
    ticking = obsq.App(namespace)
    ticks: list[int] = []

    @ticking.task("tick")
    async def tick(task: obsq.Task) -> None:
        ticks.append(1)

    ticking.periodic("@every 60s", "tick")
    with caplog.at_level(logging.DEBUG, logger="obsq"):
        async with Environment(ticking, redis_url=redis_url, namespace=namespace) as env:
            await env.advance(3 * 3600 + 120)  # the first fire a minute in, a count an hour on
    fires = [r for r in caplog.records if r.getMessage().startswith("schedule tick fired (")]
    counts = [r for r in caplog.records if "fired 60 time(s) in the last 60 minutes"
              in r.getMessage()]
    assert len(ticks) >= 180 and len(fires) == len(ticks)
    assert [r.levelno for r in fires].count(logging.INFO) == 1  # the first
    assert len(counts) == 3 and all(r.levelno == logging.INFO for r in counts)
