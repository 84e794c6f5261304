"""Rolling deploys: workers of two versions share a queue, and the newer one has a task type
the older one has no handler for. The older worker hands such tasks on, no retry spent, and
a task no worker has a handler for ends dead only after `unknown_type_max_age`."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import REGISTRY
from support import depth, wait_until

import obsq
from obsq.errors import ConfigurationError
from obsq.settings import WorkerSettings

TASKS = 200


def versions(namespace: str) -> tuple[obsq.App, obsq.App]:
    """The App of version 1, and that of version 2, which adds the type `report:new`."""
    old, new = obsq.App(namespace=namespace), obsq.App(namespace=namespace)
    for app in (old, new):
        @app.task("report:old")
        async def report_old(task: obsq.Task) -> str:
            return "old"

    @new.task("report:new")
    async def report_new(task: obsq.Task) -> int:
        return task.payload

    return old, new


async def test_a_new_type_loses_nothing_while_old_and_new_workers_share_a_queue(
        namespace, client, broker, start_worker, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="obsq")
    old, new = versions(namespace)
    handed_on: list[str] = []
    old.on_outcome(lambda task, outcome, error: handed_on.append(task.id)
                   if outcome == "handed_on" else None)
    infos = await client.enqueue_many([obsq.Job("report:new", i, retention=600)
                                       for i in range(TASKS)])
    await start_worker(old)  # the old version first, as a rolling deploy leaves it running
    await wait_until(lambda: handed_on, what="the old worker took tasks of the new type")
    await start_worker(new)
    started = time.monotonic()
    for i, info in enumerate(infos):
        assert await client.result(info, timeout=120) == i
    elapsed = time.monotonic() - started
    for info in infos:
        stored = await client.info(info.id)
        assert (stored.state, stored.retry_count) == ("completed", 0)
    assert (await depth(broker))["dead"] == 0
    said = [r for r in caplog.records if "no handler for task type 'report:new'" in
            r.getMessage()]
    assert len(said) == 1, "said once per type, not once per task"
    print(f"{TASKS} tasks of the new type: all completed {elapsed:.1f} s after the new "
          f"worker started, none dead, no retry; {len(handed_on)} hand-ons by the old worker")


def _unknown_type_count(queue: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("obsq_tasks_unknown_type_total",
                                     {"queue": queue, "outcome": outcome}) or 0.0


async def test_a_type_no_worker_has_ends_dead_after_the_age(
        namespace, client, inspector, start_worker) -> None:
    old, _ = versions(namespace)
    handed_on = _unknown_type_count("default", "handed_on")
    dead_before = _unknown_type_count("default", "dead")
    await start_worker(old, metrics=True, unknown_type_max_age=3)
    info = await client.enqueue("report:new", 1, retention=600, max_retry=2)
    with pytest.raises(obsq.TaskFailed, match="no worker that took it had one within 3 s"):
        await client.result(info, timeout=30)
    dead = await client.info(info.id)
    assert dead.state == "dead"
    assert dead.retry_count == 0
    assert dead.error.startswith("UnknownTaskType: no handler is registered for task type "
                                 "'report:new'; no worker that took it had one within 3 s "
                                 "(handed on ")
    assert _unknown_type_count("default", "handed_on") > handed_on
    assert _unknown_type_count("default", "dead") == dead_before + 1
    # requeued by an operator, it gets a fresh window
    await inspector.requeue("default", "dead", [info.id])
    handed_on_again = await wait_until(lambda: _in_state(client, info.id, "scheduled"))
    assert handed_on_again.retry_count == 0
    # the known type runs as ever beside it
    assert await client.result(await client.enqueue("report:old", retention=60),
                               timeout=10) == "old"


async def test_a_catch_all_route_knows_every_type(namespace, client, start_worker) -> None:
    app = obsq.App(namespace=namespace)

    @app.task("*")
    async def anything(task: obsq.Task) -> str:
        return task.type

    await start_worker(app)
    info = await client.enqueue("report:new", retention=60)
    assert await client.result(info, timeout=10) == "report:new"
    assert (await client.info(info.id)).retry_count == 0


def test_the_age_is_a_setting() -> None:
    assert WorkerSettings().unknown_type_max_age == 24 * 3600
    assert WorkerSettings.from_env({"OBSQ_UNKNOWN_TYPE_MAX_AGE": "3600"}
                                   ).unknown_type_max_age == 3600
    with pytest.raises(ConfigurationError, match="unknown_type_max_age must be positive"):
        WorkerSettings(unknown_type_max_age=0)


async def _in_state(client: obsq.Client, task_id: str, state: str) -> obsq.TaskInfo | None:
    info = await client.info(task_id)
    return info if info.state == state else None
