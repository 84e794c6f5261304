"""The operator's commands and the console find Redis and the namespace as a worker does:
`--redis-url` and `--namespace`, else OBSQ_REDIS_URL and OBSQ_NAMESPACE, else the
defaults; so a shell or a pod that exports the variables (the chart sets them in every
container) needs no flag. Run as an operator runs them: `python -m obsq` subprocesses on a
real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from support import obsq_env, one_clear_line, run_obsq, stop_process, wait_for

import obsq
from obsq.redis_server import free_port

QUEUE = "env-queue"


@pytest.fixture
def task_id(redis_url: str, namespace: str) -> Iterator[str]:
    """A pending task in QUEUE of the test's namespace."""
    with obsq.SyncClient(redis_url, namespace=namespace) as client:
        info = client.enqueue("env:check", {"n": 1}, queue=QUEUE)
        yield info.id


def test_the_inspection_commands_read_the_variables(redis_url, namespace, task_id) -> None:
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace)
    shown = run_obsq("task", task_id, env=env)
    assert shown.returncode == 0 and task_id in shown.stdout, shown.stderr
    listed = run_obsq("queues", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [q["name"] for q in json.loads(listed.stdout)] == [QUEUE]
    paused = run_obsq("pause", QUEUE, env=env)
    assert paused.returncode == 0 and f"queue {QUEUE} paused" in paused.stdout
    assert run_obsq("unpause", QUEUE, env=env).returncode == 0


def test_a_flag_wins_over_its_variable(redis_url, namespace, task_id) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = obsq_env(OBSQ_REDIS_URL=nowhere, OBSQ_NAMESPACE=f"{namespace}x")
    shown = run_obsq("task", task_id, "--redis-url", redis_url, "--namespace", namespace,
                     env=env)
    assert shown.returncode == 0 and task_id in shown.stdout, shown.stderr
    elsewhere = run_obsq("task", task_id, "--redis-url", redis_url, env=env)
    assert elsewhere.returncode == 1
    assert f"no task {task_id!r} in namespace '{namespace}x'" in elsewhere.stderr


def test_without_the_namespace_variable_the_default_namespace_is_read(
        admin_redis_url, namespace, task_id) -> None:
    """The case an operator meets when the variable is not exported: the command says
    where it looked, and which namespaces have queues."""
    shown = run_obsq("task", task_id, env=obsq_env(OBSQ_REDIS_URL=admin_redis_url))
    assert shown.returncode == 1 and "in namespace 'obsq'" in shown.stderr
    listed = run_obsq("queues", env=obsq_env(OBSQ_REDIS_URL=admin_redis_url))
    assert listed.returncode == 0 and namespace in listed.stdout


def test_a_bad_namespace_variable_is_refused_as_by_the_worker(redis_url) -> None:
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE="a:b")
    worker = run_obsq("worker", "examples.tasks:app", "--http-port", "-1", env=env)
    stats = run_obsq("stats", env=env)
    assert worker.returncode == stats.returncode == 2
    said = one_clear_line(worker, "namespace 'a:b' must be")
    assert one_clear_line(stats).removeprefix("obsq stats") == said.removeprefix("obsq worker")


def test_the_console_reads_the_variables(redis_url, namespace, task_id, tmp_path) -> None:
    port = free_port()
    with (tmp_path / "ui.log").open("w") as log:
        console = subprocess.Popen(
            [sys.executable, "-m", "obsq", "ui", "--http-port", str(port)],
            env=obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace), stdout=log,
            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url + "/readyz"), timeout=30, what="obsq ui ready")
        assert QUEUE in httpx.get(url + "/", timeout=10).text
        assert "env:check" in httpx.get(f"{url}/tasks/{task_id}", timeout=10).text
    finally:
        assert stop_process(console) == 0, (tmp_path / "ui.log").read_text()
    assert f"console of namespace {namespace} on" in (tmp_path / "ui.log").read_text()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
