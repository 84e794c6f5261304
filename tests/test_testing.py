"""obsq.testing and its pytest plugin: the guide's example (examples/testing: test_tasks.py,
the shop it tests and its conftest) passes as a user runs it (pytest on their project, the
plugin loaded by its entry point), and the Environment steps the clock through what the
example does not show (a lease that ends, a usage error)."""

from __future__ import annotations

import collections
import itertools
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
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


PLAIN_TESTS = """\
import obsq
import pytest

app = obsq.App()
runs = []


@app.task("job")
async def job(task):
    runs.append(task.id)


app.periodic("@every 1m", "job")


@pytest.fixture
def obsq_app():
    return app


async def test_plain(obsq_env):
    await obsq_env.client.enqueue("job")
    await obsq_env.advance(60)
    assert len(runs) == 2


@pytest.mark.obsq_app(app, schedules=False)
async def test_without_schedules(obsq_env):
    runs.clear()
    await obsq_env.advance(3600)
    assert runs == [] and obsq_env.scheduler is None
"""


def run_plain_test(tmp_path, name: str) -> subprocess.CompletedProcess[str]:
    """One test of PLAIN_TESTS, in a project of its own, its WARNING lines and above shown
    as they are logged."""
    (tmp_path / "test_plain.py").write_text(PLAIN_TESTS)
    result = run_pytest(f"{tmp_path / 'test_plain.py'}::{name}", "--rootdir", str(tmp_path),
                        "-o", "asyncio_mode=auto", "-o", "log_cli=true",
                        "--log-cli-level=WARNING")
    assert result.returncode == 0 and "1 passed" in result.stdout, \
        result.stdout + result.stderr
    return result


def test_a_plain_obsq_env_test_logs_no_warning(tmp_path) -> None:
    """The fixture runs the App in a namespace of the test's own, where its Client writes
    too: nothing is mismatched, so nothing is warned of, from the worker's start to the
    environment's end."""
    result = run_plain_test(tmp_path, "test_plain")
    warned = [line for line in result.stdout.splitlines() if line.startswith(
        ("WARNING", "ERROR", "CRITICAL"))]
    assert warned == [], result.stdout


def test_the_marker_turns_schedules_off(tmp_path) -> None:
    run_plain_test(tmp_path, "test_without_schedules")


async def test_a_worker_told_another_namespace_than_its_apps_still_says_so(
        namespace: str, start_worker, caplog: pytest.LogCaptureFixture) -> None:
    """The environment's App runs in the environment's namespace; a worker whose namespace
    is not its App's is warned of as before."""
    with caplog.at_level(logging.WARNING, logger="obsq"):
        await start_worker(obsq.App("elsewhere"), namespace=namespace)
    assert f"worker serves namespace {namespace!r} (--namespace or OBSQ_NAMESPACE), not " \
           "its App's 'elsewhere'" in caplog.text


async def test_schedules_off_fire_nothing(redis_url: str, namespace: str) -> None:
    ticking = obsq.App(namespace)
    runs: list[str] = []

    @ticking.task("tick")
    async def tick(task: obsq.Task) -> None:
        runs.append(task.id)

    ticking.periodic("@every 1m", "tick")
    async with Environment(ticking, redis_url=redis_url, namespace=namespace,
                           schedules=False) as env:
        await env.client.schedule("added", "@every 1m", "tick")
        await env.client.enqueue("tick", delay=7200)
        await env.advance(7200)
        assert env.scheduler is None
        assert runs != [] and all("@" not in task_id for task_id in runs)  # the delayed one


async def test_a_day_of_a_frequent_schedule_takes_seconds_and_fires_every_time(
        redis_url: str, namespace: str) -> None:
    """Fires that are all the clock waits for are caught up many at a time (as a scheduler
    whose round came late within missed_after), not one step, claim and enqueue each: a
    day of `@every 5s` took 142-160 s (python tests/bench/testing_day.py measures it). Each
    fire is enqueued once under its own id, none counted missed, an entry of
    missed="skip" too."""
    ticking = obsq.App(namespace)
    fires: collections.Counter[str] = collections.Counter()

    @ticking.task("tick")
    async def tick(task: obsq.Task) -> None:
        fires[task.headers["obsq-schedule"]] += 1

    ticking.periodic("@every 5s", "tick", name="often")
    ticking.periodic("@every 1m", "tick", name="minutely", missed="skip")
    async with Environment(ticking, redis_url=redis_url, namespace=namespace) as env:
        hooked: collections.Counter[tuple[str, str]] = collections.Counter()
        batches: list[int] = []  # fires told to the hooks at once
        assert env.scheduler is not None

        @env.scheduler.on_fire
        def count(entry: str, outcome: str, n: int) -> None:
            hooked[(entry, outcome)] += n
            batches.append(n)

        await env.advance(timedelta(days=1))
        listed = {s.name: s for s in await env.client.schedules()}
    assert fires == {"often": 17_280, "minutely": 1440}
    assert hooked == {("often", "fired"): 17_280, ("minutely", "fired"): 1440}
    assert [(s.fire_count, s.missed_count) for s in listed.values()] == [(17_280, 0),
                                                                         (1440, 0)]
    assert len(batches) < 200, len(batches)  # not a step, a claim and an enqueue a fire


async def test_fires_run_at_their_own_moment_while_anything_else_is_due(
        redis_url: str, namespace: str) -> None:
    """A fire whose task leaves a delayed task behind keeps the clock stepping fire by
    fire: each follow-up runs two seconds after its fire, as in production."""
    ticking = obsq.App(namespace)
    at: dict[str, list[float]] = {"tick": [], "follow-up": []}
    running: list[Environment] = []

    @ticking.task("tick")
    async def tick(task: obsq.Task) -> None:
        at["tick"].append(running[0].clock.time())
        await running[0].client.enqueue("follow-up", delay=2)

    @ticking.task("follow-up")
    async def follow_up(task: obsq.Task) -> None:
        at["follow-up"].append(running[0].clock.time())

    ticking.periodic("@every 5s", "tick")
    async with Environment(ticking, redis_url=redis_url, namespace=namespace) as env:
        running.append(env)
        await env.advance(600)
    assert len(at["tick"]) == 120 and len(at["follow-up"]) == 119  # the last one at 602 s
    assert {b - a for a, b in itertools.pairwise(at["tick"])} == {5.0}
    assert [b - a for a, b in zip(at["tick"], at["follow-up"])] == [2.0] * 119


