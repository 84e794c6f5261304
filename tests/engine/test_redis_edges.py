"""Redis-side edge cases: recovery of a lost worker's many attempts in bounded steps, locks
only their owner can release, due times on Redis's clock whatever the producer's, settles
re-sent after a lost reply, and completions a stopping worker cannot record."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from support import depth, redis_now_ms, wait_until

import obsq
from obsq.app import Hooks
from obsq.broker import Attempt, Broker, Completion
from obsq.broker.calls import OPERATIONS
from obsq.broker.keeping import BlockingKeeping
from obsq.engine.maintenance import Recoverer
from obsq.errors import BrokerError


async def test_a_lost_workers_attempts_are_recovered_in_bounded_steps(client, broker) -> None:
    await client.enqueue_many([obsq.Job("t", i) for i in range(2500)])
    _, fetched = await broker.dequeue("default", 2500, "ghost", lease_seconds=600)
    assert len(fetched.tasks) == 2500
    keeping = BlockingKeeping(broker)  # as a worker's heartbeat thread beats
    await asyncio.to_thread(keeping.heartbeat, "ghost", {"queues": ["default"]}, 0.05)
    keeping.close()  # then silence
    await wait_until(lambda: broker.lost_workers(), timeout=5)

    requeued, _, cursor, _ = await broker.recover("default", 5, 1000, ["ghost"])
    assert cursor != "0" and requeued <= 1100  # one call scans about `batch` entries
    recoverer = Recoverer(broker, "tester", 1.0, 1.0, max_recoveries=5,
                          hooks=Hooks("recovery hook"))
    await recoverer.work()  # the sweep calls again until the scan ends
    assert (await depth(broker))["pending"] == 2500
    assert (await depth(broker))["active"] == 0
    assert await broker.lost_workers() == []  # forgotten once its tasks are back


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
async def test_a_delay_counts_on_redis_clock_whatever_the_producers(
        app, client, broker, raw_redis, start_worker, monkeypatch, skew) -> None:
    ran: list[int] = []  # Redis's clock when it ran

    @app.task("later")
    async def later(task: obsq.Task):
        ran.append(redis_now_ms(raw_redis))

    await start_worker()
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew)  # a producer's wrong clock
    before = redis_now_ms(raw_redis)
    info = await client.enqueue("later", delay=1.5)
    after = redis_now_ms(raw_redis)
    assert info.state == "scheduled"
    due = int(raw_redis.hget(broker.keys("default").task(info.id), "due"))
    assert before + 1500 <= due <= after + 1500
    await wait_until(lambda: ran, timeout=10)
    assert ran[0] >= due  # not at once, as a clock behind would make it


async def test_durations_under_a_millisecond_are_refused_before_anything_is_written(
        client, broker) -> None:
    for option in ("unique_for", "retention"):
        with pytest.raises(ValueError, match=option):
            await client.enqueue_many([obsq.Job("t", 1),
                                       obsq.Job("t", 2, **{option: 0.0001})])
    assert await broker.queues() == []
    assert sum((await depth(broker)).values()) == 0


@pytest.mark.parametrize("payload", [float("nan"), {"a": [1, float("inf")]},
                                     [{"x": -float("inf")}]])
async def test_nan_and_infinities_are_refused_not_turned_into_null(client, payload) -> None:
    with pytest.raises(ValueError, match="NaN or an infinity"):
        await client.enqueue("t", payload)


async def test_a_resent_settle_of_an_applied_attempt_is_accepted(client, broker) -> None:
    kept = await client.enqueue("t", 1)
    gone = await client.enqueue("t", 2)
    _, fetched = await broker.dequeue("default", 2, "w", lease_seconds=60)
    by_id = {t.id: t for t in fetched.tasks}
    done = {"default": [Completion(Attempt(kept.id, by_id[kept.id].fence), 60, b"1"),
                        Completion(Attempt(gone.id, by_id[gone.id].fence), 0, b"2")]}
    assert await broker.ack(done, "w") == {"default": [True, True]}
    # the reply was lost: the worker sends the same completions again
    assert await broker.ack(done, "w", resent=True) == {"default": [True, True]}
    # a first send cannot have been applied before: a vanished task is not this attempt's
    assert await broker.ack(done, "w") == {"default": [True, False]}

    retried = await client.enqueue("t", 3)
    _, fetched = await broker.dequeue("default", 1, "w", lease_seconds=60)
    attempt = Attempt(retried.id, fetched.tasks[0].fence)
    assert await broker.retry("default", attempt, "w", 60, "boom")
    assert await broker.retry("default", attempt, "w", 60, "boom")  # re-sent: applied once
    assert (await client.info(retried.id)).retry_count == 1


async def test_a_resent_ack_after_a_takeover_is_still_refused(client, broker) -> None:
    info = await client.enqueue("t", 1)
    _, fetched = await broker.dequeue("default", 1, "w", lease_seconds=0.01)
    await asyncio.sleep(0.05)
    assert (await broker.recover("default", 5, 100))[0] == 1  # the lease expired: taken back
    done = {"default": [Completion(Attempt(info.id, fetched.tasks[0].fence), 0, b"1")]}
    assert await broker.ack(done, "w", resent=True) == {"default": [False]}


async def test_an_ack_whose_reply_was_lost_reports_success(app, client, start_worker) -> None:
    outcomes: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))

    @app.task("t")
    async def handler(task: obsq.Task):
        return task.payload

    worker = await start_worker()
    lost = [lose_next_reply(worker.broker, "dequeue", when=lambda args: bool(args[4])),
            lose_next_reply(worker.broker, "ack", when=lambda args: True)]
    infos = await client.enqueue_many([obsq.Job("t", i, retention=60) for i in range(5)])
    assert [await client.result(info, timeout=10) for info in infos] == list(range(5))
    await wait_until(lambda: len(outcomes) == 5)
    assert any(lost), "no completion's reply was lost: the test proved nothing"
    assert outcomes == ["success"] * 5


def lose_next_reply(broker: Broker, method: str, when) -> list[bool]:
    """The next call of `method` (matching `when(args)`) reaches Redis, then fails as if the
    connection broke before the reply came back. The list returned is true once it did."""
    real = getattr(broker, method)
    fired: list[bool] = []

    async def call(*args, **kwargs):
        result = await real(*args, **kwargs)
        if not fired and when(args):
            fired.append(True)
            raise BrokerError(method, ConnectionError("connection lost before the reply"))
        return result

    setattr(broker, method, call)
    return fired


async def test_a_completion_a_stopping_worker_cannot_record_is_unrecorded(
        private_redis, namespace) -> None:
    app = obsq.App(namespace=namespace)
    outcomes: list[str] = []
    app.on_outcome(lambda task, outcome, error: outcomes.append(outcome))
    gate = asyncio.Event()

    @app.task("t")
    async def handler(task: obsq.Task):
        await gate.wait()

    worker = obsq.Worker(app, private_redis.url, shutdown_timeout=10, handle_signals=False)
    running = asyncio.create_task(worker.run())
    async with obsq.Client(private_redis.url, app=app) as client:
        await client.enqueue("t")
    await wait_until(lambda: worker.busy == 1)
    private_redis.stop()
    gate.set()
    worker.stop()
    await asyncio.wait_for(running, timeout=30)
    assert outcomes == ["unrecorded"]


def test_every_operation_a_failure_can_name_is_known() -> None:
    """obsq_redis_errors_total starts each operation's series at 0 from OPERATIONS."""
    source = "".join(p.read_text() for p in
                     (Path(obsq.__file__).parent / "broker").glob("*.py"))
    named = set(re.findall(r'_(?:guard|get_many|blpop_any|failed)\("(\w+)"', source))
    assert named and named <= set(OPERATIONS)
