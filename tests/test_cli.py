"""The `obsq worker` command line as a user meets it, on real processes and Redis: the
stop signals of `--processes N` when they reach the whole process group (a terminal's
Ctrl-C, `timeout`) or every process (systemd's KillMode=control-group), and when the
supervisor is killed; and `--route-concurrency`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import (
    ROOT,
    ObsqProcess,
    obsq_env,
    one_clear_line,
    run_obsq,
    wait_for,
    wait_until,
)

import obsq

APP = """
import asyncio, os, pathlib
import obsq

app = obsq.App(namespace=os.environ["OBSQ_NAMESPACE"])
HERE = pathlib.Path(__file__).parent


@app.task("hold")
async def hold(task):
    with open(HERE / "runs", "a") as runs:
        runs.write(task.id + "\\n")
    while not (HERE / "release").exists():
        await asyncio.sleep(0.05)
    return os.getpid()


@app.task("count")
async def count(task):
    mine = HERE / f"running-{os.getpid()}-{task.id}"
    mine.touch()
    await asyncio.sleep(0.2)
    at_once = len(list(HERE.glob(f"running-{os.getpid()}-*")))
    mine.unlink()
    return at_once
"""


def runs(directory: Path) -> list[str]:
    path = directory / "runs"
    return path.read_text().split() if path.exists() else []


def child_pids(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"worker process \d+ started: pid (\d+)", log)]


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a parent that may never reap it."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3]
    except FileNotFoundError:
        return False


@pytest.fixture
async def held(redis_url, namespace, tmp_path):
    """`obsq worker --processes 2` in a session of its own, as `setsid` starts it, with
    four tasks running in its two children (two each) until the test creates `release`."""
    (tmp_path / "hold_app.py").write_text(APP)
    supervisor = ObsqProcess(
        ["worker", "hold_app:app", "--processes", "2", "--concurrency", "2", "--http-port",
         "-1", "--shutdown-timeout", "120"],
        obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace), tmp_path,
        tmp_path / "supervisor.log", session=True)
    client = obsq.Client(redis_url, namespace=namespace)
    children: list[int] = []
    try:
        infos = [await client.enqueue("hold", retention=60) for _ in range(4)]
        await wait_until(lambda: len(runs(tmp_path)) == 4, timeout=60,
                         what="four tasks running")
        children.extend(child_pids(supervisor.log()))
        assert len(children) == 2, supervisor.log()
        yield supervisor, client, infos, children
    finally:
        (tmp_path / "release").touch()
        await client.close()
        supervisor.close()
        for pid in children:  # only if the test failed: they are not the supervisor's now
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


async def drained_once(held, tmp_path, sig: signal.Signals) -> None:
    """Both children drain, their tasks finish in their first and only run, all exit 0."""
    supervisor, client, infos, _ = held
    await wait_until(lambda: supervisor.log().count("draining: 2 task(s) running") == 2,
                     what="both children draining")
    (tmp_path / "release").touch()
    code = await asyncio.to_thread(supervisor.wait, 60)
    log = supervisor.log()
    assert code == 0, log
    assert log.count(f"received {sig.name}: draining") == 2, log
    assert f"received {sig.name}: stopping 2 worker processes (a second signal stops them " \
        "at once" in log, log
    assert "stop now" not in log and "processes now" not in log and "handed" not in log, log
    assert log.count("stopped: 2 task(s) processed") == 2, log
    for info in infos:  # each finished, in its first and only run
        assert (await client.info(info.id)).state == "completed"
    assert sorted(runs(tmp_path)) == sorted(i.id for i in infos)


async def test_a_signal_to_the_process_group_drains_every_child_once(held, tmp_path):
    os.killpg(held[0].pid, signal.SIGINT)
    await drained_once(held, tmp_path, signal.SIGINT)


async def test_a_signal_to_every_process_drains_every_child_once(held, tmp_path):
    """As systemd's KillMode=control-group stops a unit: the children get the signal the
    supervisor forwards and their own."""
    supervisor, _, _, children = held
    for pid in [supervisor.pid, *children]:
        os.kill(pid, signal.SIGTERM)
    await drained_once(held, tmp_path, signal.SIGTERM)


async def test_a_second_ctrl_c_stops_the_children_now(held, tmp_path):
    supervisor, client, infos, _ = held
    os.killpg(supervisor.pid, signal.SIGINT)
    await wait_until(lambda: supervisor.log().count("draining: 2 task(s) running") == 2,
                     what="both children draining")
    os.killpg(supervisor.pid, signal.SIGINT)
    code = await asyncio.to_thread(supervisor.wait, 60)
    log = supervisor.log()
    assert code == 0, log
    assert "received SIGINT: stopping 2 worker processes now" in log, log
    assert log.count("the supervisor says: stop now") == 2, log
    assert log.count("handed 2 unfinished task(s) back to pending") == 2, log
    for info in infos:
        assert (await client.info(info.id)).state == "pending"


async def test_children_drain_when_their_supervisor_is_killed(held, tmp_path):
    supervisor, client, infos, children = held
    supervisor.signal(signal.SIGKILL)
    await wait_until(lambda: supervisor.log().count("is gone: draining") == 2,
                     what="both children told their supervisor is gone")
    (tmp_path / "release").touch()
    await wait_until(lambda: not any(alive(pid) for pid in children), timeout=60,
                     what="both children stopped")
    log = supervisor.log()
    assert log.count("stopped: 2 task(s) processed") == 2, log
    assert "handed" not in log, log
    for info in infos:
        assert (await client.info(info.id)).state == "completed"


def test_route_concurrency_is_a_flag_read_as_its_variable_is(tmp_path):
    assert "--route-concurrency" in run_obsq("worker", "--help").stdout
    flag = run_obsq("worker", "hold_app:app", "--route-concurrency", "pdf:render=two")
    variable = run_obsq("worker", "hold_app:app",
                        env=obsq_env(OBSQ_ROUTE_CONCURRENCY="pdf:render=two"))
    assert flag.returncode == variable.returncode == 2
    assert one_clear_line(flag, "pdf:render=two", "not an integer") == \
        one_clear_line(variable)
    zero = run_obsq("worker", "hold_app:app", "--route-concurrency", "pdf:=0")
    assert zero.returncode == 2
    one_clear_line(zero, "'pdf:'", "positive integer")


async def test_route_concurrency_limits_each_worker_process(redis_url, namespace, tmp_path):
    """The flag reaches the children of `--processes 2` (each runs one `count` at a time),
    and wins over the variable they inherit."""
    (tmp_path / "hold_app.py").write_text(APP)
    supervisor = ObsqProcess(
        ["worker", "hold_app:app", "--processes", "2", "--concurrency", "4", "--http-port",
         "-1", "--route-concurrency", "count=1"],
        obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                 OBSQ_ROUTE_CONCURRENCY="count=4"), tmp_path, tmp_path / "supervisor.log")
    client = obsq.Client(redis_url, namespace=namespace)
    try:
        infos = [await client.enqueue("count", retention=60) for _ in range(8)]
        at_once = [await client.result(info, timeout=60) for info in infos]
    finally:
        await client.close()
        code = await asyncio.to_thread(supervisor.stop, 60)
        supervisor.close()
    assert code == 0, supervisor.log()
    assert at_once == [1] * 8, supervisor.log()


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    """`obsq acl | head -1`: the reader leaves before obsq writes; no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "obsq", "acl"], cwd=ROOT, env=obsq_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    proc.stdout.close()  # before the interpreter has even started
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not err, err


def test_the_scheduler_logs_at_obsq_log_level(redis_url, namespace, tmp_path) -> None:
    """As the worker, the exporter and the console do (the chart sets it for all). Its
    endpoint's line is logged before it writes the App's entries, which a test can see."""
    logs = {}
    for level in ("INFO", "WARNING"):
        (tmp_path / f"tick_{level}.py").write_text(
            f"import obsq\n\napp = obsq.App(namespace={namespace!r})\n"
            f"app.periodic('@every 1h', 'tick', name='hourly-{level}')\n")
        env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                       OBSQ_LOG_LEVEL=level, PYTHONUNBUFFERED="1")
        scheduler = ObsqProcess(["scheduler", f"tick_{level}:app", "--http-port", "0"], env,
                                tmp_path, tmp_path / f"{level}.log")
        try:
            wait_for(lambda env=env, name=f"hourly-{level}":
                     name in run_obsq("schedules", env=env).stdout,
                     timeout=30, interval=0.3, what="the App's entry written")
        finally:
            assert scheduler.stop() == 0, scheduler.log()
            logs[level] = scheduler.log()
            scheduler.close()
    assert "metrics and probes on" in logs["INFO"]
    assert "metrics and probes on" not in logs["WARNING"], logs["WARNING"]
