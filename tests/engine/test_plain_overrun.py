"""Plain handlers that overrun their timeout, in real worker processes (tests/engine/
pool_apps.py) and in the test's own: in thread mode each keeps its thread and its slot until
it returns (its attempt then ends with TaskTimeout, and its retry never runs beside it), the
other slots serve the tasks after it, a worker whose every slot is stuck takes nothing more
and fails liveness, and SIGTERM still ends the process; in process mode their process is
killed and replaced, and a process that dies fails only its own attempt."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support import ENDED, ended, wait_until

from obsq.engine.liveness import LIVENESS, READINESS, first_problem
from obsq.task import TaskInfo
from tests.engine import pool_apps

APP = "tests.engine.pool_apps:app"


def record(namespace: str, name: str) -> str:
    return f"{namespace}:rec:{name}"


def started_pids(raw_redis, namespace: str) -> dict[str, int]:
    """Task id -> pid of the process that began its (last) attempt."""
    entries = [e.decode().split() for e in raw_redis.lrange(record(namespace, "started"), 0, -1)]
    return {task_id: int(pid) for task_id, pid in entries}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def settled(client, ids: list[str]) -> list[TaskInfo] | None:
    infos = [await client.info(i) for i in ids]
    return infos if all(i.state in ENDED for i in infos) else None


@pytest.fixture
def release(raw_redis, namespace):
    """Call to end every `hang` handler still blocked; called at the end of the test too."""
    def release_all() -> None:
        raw_redis.rpush(record(namespace, "release"), *["go"] * 50)

    yield release_all
    release_all()


async def test_hung_plain_handlers_hold_only_their_own_slots(spawn_worker, client, raw_redis,
                                                           namespace, release):
    worker = spawn_worker(concurrency=3, app=APP)
    hung = [(await client.enqueue("hang", {"seconds": 40}, timeout=1, max_retry=0)).id
            for _ in range(2)]
    await wait_until(lambda: raw_redis.llen(record(namespace, "started")) == 2, timeout=30,
                     what="two hung handlers holding two of the three slots")
    await wait_until(lambda: worker.log().count("overran its timeout of 1 s") == 2,
                     timeout=30)
    quick = [(await client.enqueue("quick", i, timeout=2, max_retry=0, retention=60)).id
             for i in range(10)]

    infos = await wait_until(lambda: settled(client, quick), timeout=60, what="quick tasks end")
    assert [i.state for i in infos] == ["completed"] * 10, [i.error for i in infos]
    assert {(await client.info(i)).state for i in hung} == {"active"}  # until they return
    release()
    hung_infos = await wait_until(lambda: settled(client, hung), timeout=60)
    assert {i.state for i in hung_infos} == {"dead"}
    assert all("ran longer than its timeout of 1 s" in i.error for i in hung_infos)
    assert raw_redis.llen(record(namespace, "finished")) == 2  # both returned first


@pytest.mark.parametrize("pool", ["thread", "process"])
async def test_sigterm_ends_a_worker_whose_handlers_hang(spawn_worker, client, raw_redis,
                                                         namespace, pool):
    worker = spawn_worker("--shutdown-timeout", "1", "--pool", pool, concurrency=2, app=APP)
    stuck = await client.enqueue("sleep", 1000, timeout=1, max_retry=0)  # past it at 1 s
    running = await client.enqueue("sleep", 1000, timeout=1000)  # hung while it drains
    await wait_until(lambda: raw_redis.llen(record(namespace, "started")) == 2, timeout=30)
    await wait_until(lambda: "overran its timeout of 1 s" in worker.log(), timeout=30)

    worker.signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0  # 1 s of drain, then gone
    assert "handed 1 unfinished task(s) back to pending" in worker.log()
    assert (await client.info(running.id)).state == "pending"
    # the one past its timeout ends as its timeout decides (in threads, the worker's exit
    # ends the handler that kept its slot), not handed back to run again
    assert (await client.info(stuck.id)).state == "dead"


async def _state_is(client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def test_process_pool_kills_and_replaces_an_overrunning_handler(
        spawn_worker, client, raw_redis, namespace, release):
    worker = spawn_worker("--pool", "process", concurrency=2, app=APP)
    hung = await client.enqueue("hang", {"seconds": 60}, timeout=1, max_retry=0)
    info = await wait_until(lambda: settled(client, [hung.id]), timeout=60)
    assert info[0].state == "dead"
    assert "ran longer than its timeout of 1 s" in info[0].error
    hung_pid = started_pids(raw_redis, namespace)[hung.id]
    assert hung_pid != worker.pid
    await wait_until(lambda: not alive(hung_pid), timeout=10, what="the child killed")

    quick = [(await client.enqueue("describe", {"n": i}, retention=60)).id for i in range(4)]
    results = [await client.result(i, timeout=30) for i in quick]
    pids = {r["pid"] for r in results}
    assert pids and worker.pid not in pids and hung_pid not in pids
    assert len(pids) <= 2  # the slots' children are kept for the next tasks
    assert raw_redis.llen(record(namespace, "finished")) == 0  # the hung one never returned
    assert f"its process (pid {hung_pid}) is killed and replaced" in worker.log()


async def test_process_pool_a_dying_child_fails_only_its_own_attempt(
        spawn_worker, client, raw_redis, namespace):
    spawn_worker("--pool", "process", concurrency=3, app=APP)
    crash = await client.enqueue("crash", max_retry=0)
    quick = [(await client.enqueue("quick", i, max_retry=0, retention=60)).id
             for i in range(6)]
    infos = await wait_until(lambda: settled(client, [crash.id, *quick]), timeout=60)
    assert [i.state for i in infos[1:]] == ["completed"] * 6
    assert infos[0].state == "dead"
    assert infos[0].error.startswith("HandlerCrashed: the process running the handler of task")
    assert "died before it returned: exit status 3; it is replaced" in infos[0].error


async def test_process_pool_hands_the_whole_task_over_and_its_errors_back(
        spawn_worker, client, raw_redis, namespace):
    worker = spawn_worker("--pool", "process", concurrency=2, app=APP, tracing=True)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    info = await client.enqueue("describe", {"a": [1, 2], "b": "é"}, retention=60,
                                timeout=30, max_retry=3,
                                headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
                                         "x-tenant": "acme"})
    result = await client.result(info.id, timeout=30)
    assert result["id"] == info.id and result["type"] == "describe"
    assert result["queue"] == "default" and result["payload"] == {"a": [1, 2], "b": "é"}
    assert result["headers"]["x-tenant"] == "acme"
    assert (result["retry_count"], result["max_retry"], result["timeout"]) == (0, 3, 30)
    assert result["cancelled"] is False
    assert result["trace"].split("-")[1] == trace_id  # the process span's trace

    traceparent = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    relay = await client.enqueue("relay", {"n": 1}, retention=60, headers=traceparent)
    relayed = await client.result(relay.id, timeout=30)
    passed_on = await client.result(relayed, timeout=30)  # enqueued by a handler's process
    assert passed_on["headers"]["traceparent"].split("-")[1] == trace_id

    unsent = await client.enqueue("unsendable", retention=60)
    kept = (await wait_until(lambda: settled(client, [unsent.id]), timeout=30))[0]
    assert kept.state == "dead" and "the result of task type 'unsendable' cannot be sent " \
        "back from the handler's process" in kept.error
    for payload, problem in (({}, "not JSON-serializable"), ({"nan": 1}, "NaN or an infinity")):
        unkept = await client.enqueue("not_json", payload, retention=60)
        ended = (await wait_until(lambda u=unkept: settled(client, [u.id]), timeout=30))[0]
        assert ended.state == "dead" and problem in ended.error, ended

    progressing = await client.enqueue("progress")
    refused = (await wait_until(lambda: settled(client, [progressing.id]), timeout=30))[0]
    assert refused.state == "dead" and refused.error.startswith(
        "RuntimeError: task.update_state is not available to a plain handler run in a "
        "process pool"), refused

    failing = await client.enqueue("fail", {"n": 7})
    failed = (await wait_until(lambda: settled(client, [failing.id]), timeout=30))[0]
    assert failed.state == "dead" and failed.error == "ValueError: bad input {'n': 7}"
    stored = raw_redis.hget(f"{namespace}:{{default}}:t:{failing.id}", "tb").decode()
    assert "pool_apps.py" in stored and 'raise ValueError(f"bad input' in stored
    # told from the handler down, and where it raised, as in a thread
    assert stored.splitlines()[1].startswith(f'  File "{pool_apps.__file__}"'), stored
    line = 1 + Path(pool_apps.__file__).read_text().splitlines().index(
        '    raise ValueError(f"bad input {task.payload!r}")')
    assert f"failed at tests/engine/pool_apps.py:{line}, moved to dead" in worker.log()


async def test_process_pool_cancelling_a_plain_task_kills_its_process(
        spawn_worker, client, raw_redis, namespace, release):
    spawn_worker("--pool", "process", concurrency=2, app=APP)
    info = await client.enqueue("hang", {"seconds": 60}, timeout=120)
    await wait_until(lambda: info.id in started_pids(raw_redis, namespace), timeout=30)
    pid = started_pids(raw_redis, namespace)[info.id]
    await client.cancel(info.id)
    await wait_until(lambda: _state_is(client, info.id, "cancelled"), timeout=30)
    await wait_until(lambda: not alive(pid), timeout=10, what="the child killed")
    assert raw_redis.llen(record(namespace, "finished")) == 0


async def test_process_pool_children_do_not_outlive_a_killed_worker(
        spawn_worker, client, raw_redis, namespace):
    worker = spawn_worker("--pool", "process", concurrency=2, app=APP)
    info = await client.enqueue("sleep", 1000, timeout=2000)
    await wait_until(lambda: info.id in started_pids(raw_redis, namespace), timeout=30)
    pid = started_pids(raw_redis, namespace)[info.id]
    worker.signal(signal.SIGKILL)
    await wait_until(lambda: not alive(pid), timeout=15, what="the hung child gone too")


async def test_a_drain_counts_only_the_tasks_it_really_handed_back(
        spawn_worker, client, raw_redis, namespace):
    worker = spawn_worker("--shutdown-timeout", "1", concurrency=2, app=APP)
    info = await client.enqueue("sleep", 20, timeout=60)  # ignores task.cancelled
    await wait_until(lambda: info.id in started_pids(raw_redis, namespace), timeout=30)
    assert await client.cancel(info.id) == "running"
    # the worker took the cancel from its list in Redis (its handler sleeps on)
    await wait_until(lambda: not raw_redis.keys(f"{namespace}:{{default}}:cancel:*"),
                     what="the worker hearing of the cancel")
    worker.signal(signal.SIGTERM)  # the drain cancels the runner: the task ends cancelled
    await asyncio.to_thread(worker.wait, 60)
    assert (await client.info(info.id)).state == "cancelled"
    # it ended (cancelled) as the drain stopped it: nothing is handed back, nor said to be
    assert "unfinished task(s) back" not in worker.log(), worker.log()


# -- a timed-out plain handler in the thread pool keeps its slot until it returns ----------


def handler_threads() -> int:
    return sum(t.name.startswith("obsq-handler") for t in threading.enumerate())


async def test_hung_plain_handlers_never_hold_more_threads_than_slots(app, client,
                                                                      start_worker):
    gate = threading.Event()

    @app.task("never", timeout=0.2, max_retry=1000, retry_delay=0)
    def never(task):
        gate.wait(60)  # never returns while the test looks

    worker = await start_worker(concurrency=2)
    try:
        for _ in range(2):
            await client.enqueue("never")
        await wait_until(lambda: worker.health().stuck_slots == 2, what="both slots stuck")
        most = 0
        for _ in range(150):  # three seconds: fifteen timeouts' worth of retries
            most = max(most, handler_threads())
            await asyncio.sleep(0.02)
        assert most == 2
    finally:
        gate.set()


async def test_a_timed_out_plain_attempt_ends_before_its_retry_starts(app, client,
                                                                      start_worker):
    attempts: list[tuple[int, float, float, bool]] = []  # retry count, start, end, cancelled

    @app.task("charge", timeout=0.3, max_retry=1, retry_delay=0)
    def charge(task):
        started = time.monotonic()
        time.sleep(1.0)  # a call that cannot be interrupted, past the timeout
        attempts.append((task.retry_count, started, time.monotonic(), task.cancelled))

    await start_worker(concurrency=2)
    info = await client.enqueue("charge", retention=60)
    final = await wait_until(lambda: ended(client, info.id), timeout=30, what="both attempts")
    assert final.state == "dead" and "ran longer than its timeout of 0.3 s" in final.error
    await wait_until(lambda: len(attempts) == 2, what="both handlers returned")
    assert [a[0] for a in attempts] == [0, 1]
    (_, _, first_end, first_cancelled), (_, second_start, _, _) = attempts
    assert first_end <= second_start  # the retry waited for the first attempt's thread
    assert first_cancelled  # the first attempt was told to stop


async def test_every_slot_stuck_stops_fetching_and_fails_liveness(app, client, start_worker):
    gate = threading.Event()
    quick_ran: list[str] = []

    @app.task("hung", timeout=0.2, max_retry=0)
    def hung(task):
        gate.wait(60)

    @app.task("quick")
    def quick(task):
        quick_ran.append(task.id)

    worker = await start_worker(concurrency=2, stuck_limit=1.0)
    try:
        hung_ids = [(await client.enqueue("hung")).id for _ in range(2)]
        await wait_until(lambda: worker.health().stuck_slots == 2, what="both slots stuck")
        waiting = await client.enqueue("quick", retention=60)
        problem = await wait_until(lambda: first_problem(worker.health(), LIVENESS),
                                   timeout=20, what="liveness fails past the stuck limit")
        assert problem.startswith("2 slot(s) stuck in plain handlers that overran")
        assert first_problem(worker.health(), READINESS).startswith("every slot is stuck")
        assert (await client.info(waiting.id)).state == "pending" and not quick_ran
        assert {(await client.info(i)).state for i in hung_ids} == {"active"}
    finally:
        gate.set()
    assert (await client.result(waiting.id, timeout=30)) is None and quick_ran
    for task_id in hung_ids:  # their verdicts, recorded once their threads returned
        final = await wait_until(lambda i=task_id: ended(client, i), timeout=30)
        assert final.state == "dead" and "ran longer than its timeout" in final.error
    assert worker.health().stuck_slots == 0
    assert first_problem(worker.health(), LIVENESS) is None
