"""Processes that run handlers are replaced past their limits (`--max-tasks-per-child`,
`--max-memory-per-child`), in real worker processes on a real Redis: the process pool's
children, and the worker processes of `--processes N`. A process past its limit ends the
task it runs first: every task runs once and succeeds, none is retried."""

from __future__ import annotations

import pytest
from support import wait_until

from obsq.engine.recycling import Recycling, resident_bytes
from obsq.errors import ConfigurationError
from obsq.settings import WorkerSettings
from tests.engine.test_plain_overrun import settled, started_pids

APP = "tests.engine.pool_apps:app"


async def run_all(client, raw_redis, namespace: str, task_type: str, count: int
                  ) -> list[int]:
    """Enqueue `count` tasks of `task_type`; once all ended, the pid each ran in, after
    checking that each completed on its first attempt and began once."""
    ids = [(await client.enqueue(task_type, i, retention=60)).id for i in range(count)]
    infos = await wait_until(lambda: settled(client, ids), timeout=90, what="the tasks end")
    assert [(i.state, i.retry_count) for i in infos] == [("completed", 0)] * count, \
        [i.error for i in infos]
    starts = [e.split()[0] for e in raw_redis.lrange(f"{namespace}:rec:started", 0, -1)]
    assert sorted(s.decode() for s in starts) == sorted(ids)  # each began once
    pids = [await client.result(i) for i in ids]
    assert pids == [started_pids(raw_redis, namespace)[i] for i in ids]
    return pids


async def test_pool_children_are_replaced_after_their_tasks(spawn_worker, client, raw_redis,
                                                            namespace):
    worker = spawn_worker("--pool", "process", "--max-tasks-per-child", "2", concurrency=2,
                          app=APP)
    pids = await run_all(client, raw_redis, namespace, "where", 6)
    assert len(set(pids)) >= 3 and all(pids.count(p) <= 2 for p in pids), pids
    await wait_until(lambda: worker.log().count("(--max-tasks-per-child 2)") >= 2, timeout=30)


async def test_a_leaking_pool_child_is_replaced_before_it_grows(spawn_worker, client,
                                                                raw_redis, namespace):
    worker = spawn_worker("--pool", "process", "--max-memory-per-child", "50", concurrency=1,
                          app=APP)
    kept = await run_all(client, raw_redis, namespace, "where", 3)
    assert len(set(kept)) == 1, kept  # a child holding less than 50 MB is kept
    raw_redis.delete(f"{namespace}:rec:started")
    pids = await run_all(client, raw_redis, namespace, "leak", 3)
    assert len(set(pids)) == 3, pids  # each child kept 60 MB: past 50, replaced
    await wait_until(lambda: worker.log().count("(--max-memory-per-child 50)") >= 3,
                     timeout=30)
    assert "HandlerCrashed" not in worker.log()


async def test_worker_processes_drain_and_are_replaced_after_their_tasks(
        spawn_worker, client, raw_redis, namespace):
    worker = spawn_worker("--processes", "2", "--max-tasks-per-child", "3", concurrency=1,
                          app=APP)
    pids = await run_all(client, raw_redis, namespace, "where", 12)
    assert len(set(pids)) >= 4 and all(pids.count(p) <= 3 for p in pids), pids
    await wait_until(lambda: worker.log().count("drained past its limits") >= 3, timeout=30)


def test_limits_are_read_from_the_environment_and_checked():
    settings = WorkerSettings.from_env({"OBSQ_MAX_TASKS_PER_CHILD": "100",
                                        "OBSQ_MAX_MEMORY_PER_CHILD": "512"})
    assert (settings.max_tasks_per_child, settings.max_memory_per_child) == (100, 512)
    with pytest.raises(ConfigurationError, match="max_tasks_per_child must be a whole"):
        WorkerSettings.from_env({"OBSQ_MAX_TASKS_PER_CHILD": "-1"})
    with pytest.raises(ConfigurationError, match="max_memory_per_child must be whole MB"):
        WorkerSettings.from_env({"OBSQ_MAX_MEMORY_PER_CHILD": "-5"})


def test_a_process_is_spent_by_its_count_or_its_resident_memory():
    assert not Recycling() and Recycling().spent(10**6) is None
    assert Recycling(max_tasks=3).spent(2) is None
    assert Recycling(max_tasks=3).spent(3) == "tasks"
    here = resident_bytes() / (1 << 20)
    assert 1 < here < 10_000  # the resident set now, in MB
    assert Recycling(max_memory_mb=here * 2).spent(1) is None
    assert Recycling(max_memory_mb=here / 2).spent(1) == "memory"


async def test_a_worker_process_replaced_waits_for_its_other_running_tasks(
        spawn_worker, client, raw_redis, namespace):
    # its shutdown timeout is far shorter than the slow tasks: a drain bounded by it would
    # hand them back, to run a second time
    slow, quick = [], []
    for i in range(4):  # a fetch of two takes a slow task and a quick one
        slow.append((await client.enqueue("sleep", 2, retention=60)).id)
        quick.append((await client.enqueue("where", i, retention=60)).id)
    worker = spawn_worker("--processes", "2", "--max-tasks-per-child", "1", concurrency=2,
                          app=APP, OBSQ_SHUTDOWN_TIMEOUT="0.2")
    infos = await wait_until(lambda: settled(client, slow + quick), timeout=90)
    assert [(i.state, i.retry_count) for i in infos] == [("completed", 0)] * 8, \
        [i.error for i in infos]
    starts = sorted(e.split()[0].decode()
                    for e in raw_redis.lrange(f"{namespace}:rec:started", 0, -1))
    assert starts == sorted(slow + quick)  # each began once: none was handed back
    assert "handed" not in worker.log() and "drained past its limits" in worker.log()
