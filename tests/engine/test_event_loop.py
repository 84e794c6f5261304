"""The worker's event loop (obsq/engine/eventloop.py): uvloop where installed, asyncio's own when
OBSQ_LOOP says so or uvloop is missing, and a worker asked for uvloop without it does not
start. `obsq worker` runs its tasks on either and says which at start, in a process whose
garbage collector is paced for a worker unless the process paced it itself."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from pathlib import Path

import pytest
from support import ROOT, obsq_env, one_clear_line, run_obsq, wait_until

import obsq
from obsq.engine import eventloop
from obsq.errors import ConfigurationError
from obsq.settings import WorkerSettings


@pytest.fixture(autouse=True)
def collector_restored():
    """eventloop.run paces this test process's collector: put it back for the next tests."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_worker_process_collector_is_paced_unless_already_set() -> None:
    gc.set_threshold(*eventloop.PYTHON_THRESHOLDS)
    eventloop.run(_loop_name(), "asyncio")
    assert gc.get_threshold() == (eventloop.YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # start-up's objects out of the collector's sight
    gc.set_threshold(500, 5, 5)  # the process's own choice stays
    eventloop.run(_loop_name(), "asyncio")
    assert gc.get_threshold() == (500, 5, 5)


def test_the_loop_setting_comes_from_obsq_loop_and_is_checked() -> None:
    assert WorkerSettings.from_env(environ={}).loop == "auto"
    assert WorkerSettings.from_env(environ={"OBSQ_LOOP": "asyncio"}).loop == "asyncio"
    with pytest.raises(ConfigurationError, match="loop must be auto or uvloop or asyncio"):
        WorkerSettings.from_env(environ={"OBSQ_LOOP": "trio"})


def test_asyncio_is_the_loop_asked_for_or_the_one_left_without_uvloop(monkeypatch) -> None:
    assert eventloop.run(_loop_name(), "asyncio") == "asyncio"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert eventloop.run(_loop_name(), "auto") == "asyncio"
    with pytest.raises(ConfigurationError, match=r"pip install 'obsq\[uvloop\]'"):
        eventloop.uses_uvloop("uvloop")
    # a worker's start-up log says why it is not on uvloop: auto found none
    assert eventloop.run(_described("auto"), "auto").startswith(
        "asyncio (uvloop is not installed: pip install 'obsq[uvloop]'")
    assert eventloop.run(_described("asyncio"), "asyncio") == "asyncio"  # as asked


def test_uvloop_is_the_default_where_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    assert eventloop.run(_loop_name(), "auto") == f"uvloop {uvloop.__version__}"
    assert eventloop.run(_loop_name(), "uvloop") == f"uvloop {uvloop.__version__}"


@pytest.mark.parametrize("command", [
    ["worker", "tests.engine.apps:app", "--loop", "uvloop"],
    ["worker", "tests.engine.apps:app", "--loop", "uvloop", "--processes", "2"],
    ["demo"]])
def test_a_command_asked_for_uvloop_without_it_says_so_in_one_line(
        command: list[str], tmp_path: Path) -> None:
    """Said before the app is loaded, a supervisor's children started or the demo begins,
    and nothing else is printed (no coroutine left never awaited)."""
    (tmp_path / "uvloop").mkdir()  # an uvloop that does not import: as if not installed
    (tmp_path / "uvloop" / "__init__.py").write_text("raise ImportError('no uvloop here')\n")
    env = obsq_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), OBSQ_LOOP="uvloop")
    result = run_obsq(*command, env=env)
    one_clear_line(result, f"obsq {command[0]}:", "uvloop is not installed", "--loop or OBSQ_LOOP")
    assert result.returncode == 2


def test_the_demo_says_a_wrong_worker_setting_before_it_begins() -> None:
    result = run_obsq("demo", env=obsq_env(OBSQ_LOOP="trio"))
    one_clear_line(result, "obsq demo: loop must be auto or uvloop or asyncio, got 'trio'")
    assert result.returncode == 2


async def _loop_name() -> str:
    return eventloop.loop_name()


async def _described(choice: str) -> str:
    return eventloop.described(choice)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_the_worker_command_runs_tasks_on_the_loop_it_names(
        loop: str, spawn_worker, redis_url: str, namespace: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    worker = spawn_worker(OBSQ_LOOP=loop)
    await wait_until(lambda: f"event loop {loop}" in worker.log(), timeout=20)
    async with obsq.Client(redis_url, namespace=namespace) as client:
        infos = [await client.enqueue("sleep", {"first": 0.01}, retention=60)
                 for _ in range(20)]
        results = await asyncio.gather(*(client.result(i, timeout=20) for i in infos))
    assert results == [{"attempt": 1}] * 20
