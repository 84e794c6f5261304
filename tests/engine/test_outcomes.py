"""What the outcome and recovery hooks report (metrics and tracing are built on them), and
leases held for as long as a handler runs."""

from __future__ import annotations

import asyncio
import os
import types

import pytest
from support import wait_until

import obsq
from obsq.broker import Broker
from obsq.engine import fetching
from obsq.engine.fetching import BUFFER_HOLD, TIMER_SLACK, Slots
from obsq.task import AttemptState


async def test_outcome_hooks_see_every_settled_attempt(app, client, redis_url,
                                                       start_worker) -> None:
    outcomes: list[tuple[str, str, str | None]] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(
        (task.payload, outcome, type(error).__name__ if error else None)))

    @app.on_outcome
    def broken_hook(task, outcome, error):
        raise RuntimeError("a failing hook must not break the worker")

    release = asyncio.Event()

    @app.task("t", retry_delay=0)
    async def handler(task: obsq.Task):
        if task.payload == "fails once" and task.retry_count == 0:
            raise ValueError("once")
        if task.payload == "dies":
            raise obsq.SkipRetry("no")
        if task.payload == "blocks":
            await release.wait()
        return task.payload

    worker = obsq.Worker(app, redis_url, concurrency=4, shutdown_timeout=0.2, handle_signals=False)
    running = asyncio.create_task(worker.run())
    for payload in ("ok", "fails once", "dies"):
        await client.enqueue("t", payload)
    await wait_until(lambda: len(outcomes) == 4)
    assert sorted(outcomes) == sorted([("ok", "success", None),
                                       ("fails once", "retry", "ValueError"),
                                       ("fails once", "success", None),
                                       ("dies", "dead", "SkipRetry")])
    outcomes.clear()
    await client.enqueue("t", "blocks")
    await wait_until(lambda: worker.busy == 1)
    worker.stop()
    await asyncio.wait_for(running, timeout=10)
    assert outcomes == [("blocks", "requeued", None)]


async def test_an_attempt_that_lost_its_lease_is_reported_and_refused(
        app, client, broker: Broker, start_worker) -> None:
    outcomes: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))
    recoveries: list[tuple[str, str, int]] = []
    app.on_recovery(lambda queue, reason, count: recoveries.append((queue, reason, count)))
    taken_over = asyncio.Event()
    attempts: list[str] = []

    @app.task("slow")
    async def slow(task: obsq.Task):
        attempts.append(task.id)  # a recovery does not count as a retry: count here
        if len(attempts) == 1:
            await taken_over.wait()
            return "from the first attempt"
        return "from the second attempt"

    worker = await start_worker()
    info = await client.enqueue("slow", retention=60)
    await wait_until(lambda: worker.busy == 1)
    # the cluster decides this worker is gone (as after a network partition)
    assert (await broker.recover("default", max_recoveries=5, batch=100,
                                lost_workers=[worker.id]))[:3] == (1, 0, "0")
    taken_over.set()
    assert await client.result(info, timeout=10) == "from the second attempt"
    await wait_until(lambda: sorted(outcomes) == ["lease_lost", "success"])
    # the takeover was the test's: the worker is alive, so its own recoverer took nothing
    assert recoveries == []


async def test_a_task_longer_than_its_lease_keeps_it(app, client, start_worker) -> None:
    runs: list[int] = []
    recoveries: list[str] = []
    app.on_recovery(lambda queue, reason, count: recoveries.append(reason))

    @app.task("long")
    async def long(task: obsq.Task):
        runs.append(task.retry_count)
        await asyncio.sleep(2.5)  # more than two leases of 1 s
        return "done"

    await start_worker(lease_seconds=1)
    infos = [await client.enqueue("long", i, retention=60) for i in range(3)]
    for info in infos:
        assert await client.result(info, timeout=20) == "done"
    assert runs == [0, 0, 0]  # never taken back and run again
    assert recoveries == []


async def test_prefetched_tasks_keep_their_leases_too(app, client, start_worker) -> None:
    """While tasks are short a worker fetches ahead into a buffer; a task held there
    behind a slow one waits longer than its lease, and must not be taken back."""
    runs: list[object] = []
    recoveries: list[str] = []
    app.on_recovery(lambda queue, reason, count: recoveries.append(reason))

    @app.task("t")
    async def handler(task: obsq.Task):
        runs.append(task.payload)
        if str(task.payload).startswith("slow"):
            await asyncio.sleep(2.2)  # two leases

    await client.enqueue_many([obsq.Job("t", i) for i in range(40)]
                              + [obsq.Job("t", "slow 1"), obsq.Job("t", "slow 2")])
    worker = await start_worker(concurrency=1, lease_seconds=1)
    await wait_until(lambda: "slow 1" in runs, timeout=10)
    # the scenario really happens: the second slow task waits in the prefetch buffer
    await wait_until(lambda: [t.payload for t in worker.slots.buffer] == ["slow 2"], timeout=5)
    await wait_until(lambda: "slow 2" in runs, timeout=30)
    # a slow task taken back would be pending ahead of this one, and run before it
    assert await client.result(await client.enqueue("t", "last", retention=60),
                               timeout=30) is None
    assert runs == [*range(40), "slow 1", "slow 2", "last"]
    assert recoveries == []


async def test_tasks_fetched_ahead_of_hung_handlers_go_to_another_worker(
        app, client, start_worker) -> None:
    """After short tasks a worker fetches far ahead of its slots; when its handlers then
    hang, what it fetched ahead goes back to the head of the queue, in its order, once no
    handler has ended for BUFFER_HOLD, another worker runs it, and the first fetches no
    more ahead."""
    release = asyncio.Event()
    ran_by: dict[object, str] = {}
    second_ran: list[object] = []
    other = obsq.App(namespace=app.namespace)

    @app.task("t")
    async def first(task: obsq.Task):
        if task.payload == "hold":
            await release.wait()
        ran_by[task.payload] = "first"

    @other.task("t")
    async def second(task: obsq.Task):
        ran_by[task.payload] = "second"
        second_ran.append(task.payload)

    worker = await start_worker(concurrency=2)
    try:
        await client.enqueue_many([obsq.Job("t", i) for i in range(40)])
        await wait_until(lambda: worker.processed >= 40, what="the short tasks")
        later = [f"later {i}" for i in range(20)]
        await client.enqueue_many([obsq.Job("t", "hold", task_id=f"hold-{i}")
                                   for i in range(2)] + [obsq.Job("t", p) for p in later])
        # the scenario really happens: the later tasks wait in the first worker's buffer
        await wait_until(lambda: len(worker.slots.buffer) == len(later), timeout=5,
                         what="the buffer fetched ahead")
        given_back = asyncio.get_running_loop().time()
        await start_worker(other, concurrency=2)
        await wait_until(lambda: all(ran_by.get(p) == "second" for p in later), timeout=10,
                         what="the later tasks on the other worker")
        assert asyncio.get_running_loop().time() - given_back >= BUFFER_HOLD * 0.9
        assert second_ran == later  # given back in their order, at the head of the queue
        assert worker.busy == 2 and not worker.slots.buffer  # it took nothing back
        assert worker.slots.room()[0] == 0  # nothing more ahead while no handler ended
    finally:
        release.set()
    await wait_until(lambda: ran_by.get("hold") == "first", what="the held tasks")


def test_the_buffer_goes_back_when_its_hold_ends_though_the_wait_ends_a_millisecond_early(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetcher waits `hold_left()` and TIMER_SLACK for a slot to free. uvloop's timers
    may end that wait up to a millisecond early; the buffer must then go back, not a whole
    hold later."""
    now = [100.0]
    monkeypatch.setattr(fetching.time, "monotonic", lambda: now[0])
    buffered = Slots(1, None, "w", run=None, admit=None, limits=None)  # type: ignore[arg-type]
    now[0] = 100.3
    task = types.SimpleNamespace(_attempt=AttemptState(fetched_at=now[0]))
    buffered.buffer.append(task)  # type: ignore[arg-type]
    now[0] = 100.8
    wait = buffered.hold_left() + TIMER_SLACK
    assert wait == pytest.approx(BUFFER_HOLD - 0.5 + TIMER_SLACK)
    assert buffered.stuck() == []
    now[0] += wait - 0.001
    assert buffered.stuck() == [task]
    assert not buffered.buffer and buffered.hold_left() == BUFFER_HOLD


@pytest.mark.parametrize("plain", [False, True], ids=["async", "thread"])
async def test_a_failed_attempt_says_where_it_raised_and_its_traceback_starts_at_the_handler(
        plain: bool, app, client, inspector, start_worker, caplog) -> None:
    def charge(task: obsq.Task) -> None:
        raise ValueError("card declined")

    async def charge_async(task: obsq.Task) -> None:
        charge(task)

    app.task("charge", max_retry=0)(charge if plain else charge_async)
    await start_worker()
    info = await client.enqueue("charge", retention=60)
    detail = await wait_until(lambda: _dead(inspector, info.id))
    raising = f"{os.path.relpath(__file__)}:{charge.__code__.co_firstlineno + 1}"
    assert f"task {info.id} (charge) failed at {raising}, moved to dead: ValueError: card " \
           "declined" in caplog.text
    frames = [line for line in detail.traceback.splitlines() if line.startswith("  File ")]
    assert "/obsq/" not in frames[0] and "charge" in frames[0], detail.traceback
    assert frames[-1].endswith(", in charge"), detail.traceback


async def test_a_failure_obsq_raised_itself_names_no_place(
        app, client, inspector, start_worker, caplog) -> None:
    @app.task("slow", max_retry=0, timeout=0.1)
    async def slow(task: obsq.Task) -> None:
        await asyncio.sleep(5)

    await start_worker()
    info = await client.enqueue("slow", retention=60)
    await wait_until(lambda: _dead(inspector, info.id))
    assert f"task {info.id} (slow) failed, moved to dead: TaskTimeout" in caplog.text


async def _dead(inspector, task_id: str):
    detail = await inspector.task(task_id)
    return detail if detail.state == "dead" else None
