"""The worker's settler on its own, on a real Redis: completions gather until the worker
next talks to Redis and ride along that call; a call that failed keeps them for the next
one (marked resent, so that a first send Redis applied is recognised); a stale fencing
token is refused; and close records what is left, or gives up when Redis stays away."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from support import depth

from obsq.app import Hooks, OutcomeHook
from obsq.broker import Broker, Completions
from obsq.engine.execution import Verdict
from obsq.engine.settlement import Settler
from obsq.errors import BrokerError
from obsq.redis_server import RedisServer
from obsq.task import AttemptState, Job, Task, build_message

WORKER = "w1"


async def taken(broker: Broker, count: int, fence_offset: int = 0) -> list[Task]:
    """`count` tasks enqueued and taken under lease by WORKER, as the worker holds them."""
    await broker.register_queues(["default"])
    await broker.enqueue("default", [build_message(Job("t", i, retention=60))
                                     for i in range(count)])
    _, fetched = await broker.dequeue("default", count, WORKER, 60)
    return [Task(id=raw.id, type=raw.type, queue="default", raw_payload=raw.payload,
                 raw_headers=raw.headers, retry_count=raw.retried, max_retry=0, timeout=60,
                 retention=60,
                 attempt=AttemptState(fence=raw.fence + fence_offset, slot=raw.slot))
            for raw in fetched.tasks]


def hooks(*told: OutcomeHook) -> Hooks[[Task, str, BaseException | None]]:
    """The outcome hooks of a Settler, as an App holds them."""
    registry: Hooks[[Task, str, BaseException | None]] = Hooks("outcome hook")
    registry.extend(told)
    return registry


def success(i: int) -> Verdict:
    return Verdict("success", result=str(i).encode())


async def until(condition) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the tasks of the loop never got there")


def outcome_hook(outcomes: list[tuple[str, str]]):
    return lambda task, outcome, error: outcomes.append((task.id, outcome))


async def test_completions_wait_for_the_next_call_and_ride_along_it(broker, inspector
                                                                   ) -> None:
    tasks = await taken(broker, 5)
    outcomes: list[tuple[str, str]] = []
    settler = Settler(broker, WORKER, hooks(outcome_hook(outcomes)), unknown_type_max_age=60)
    settling = [asyncio.ensure_future(settler.settle(t, success(i)))
                for i, t in enumerate(tasks)]
    await until(settler.acks.waiting.is_set)
    assert (await depth(broker))["active"] == 5  # nothing sent yet: no timer, no call
    assert outcomes == []
    carried: list[Completions] = []

    async def fetch(completions: Completions, resent: bool):
        carried.append(completions)
        return await broker.dequeue("default", 1, WORKER, 60, completions, resent)

    fetched = await settler.acks.ride(fetch)
    assert fetched.tasks == []  # the fetch itself ran in the same round trip
    assert [len(c["default"]) for c in carried] == [5]
    assert await asyncio.gather(*settling) == ["success"] * 5
    assert sorted(outcomes) == sorted((t.id, "success") for t in tasks)
    assert not settler.acks.waiting.is_set()
    assert (await depth(broker))["completed"] == 5
    assert (await inspector.task(tasks[3].id)).result == 3


async def test_completions_of_a_failed_call_ride_the_next_marked_resent(broker) -> None:
    """The first call reached Redis, then its reply was lost: the second send of the same
    completions is accepted, not refused as a stale attempt."""
    tasks = await taken(broker, 3)
    settler = Settler(broker, WORKER, hooks(), unknown_type_max_age=60)
    settling = [asyncio.ensure_future(settler.settle(t, success(i)))
                for i, t in enumerate(tasks)]
    await until(settler.acks.waiting.is_set)
    sends: list[tuple[int, bool]] = []

    async def applied_then_lost(completions: Completions, resent: bool):
        sends.append((len(completions["default"]), resent))
        await broker.ack(completions, WORKER, resent)
        raise BrokerError("ack", ConnectionError("connection lost before the reply"))

    with pytest.raises(BrokerError):
        await settler.acks.ride(applied_then_lost)
    assert settler.acks.waiting.is_set()  # kept, for the next call
    assert not any(s.done() for s in settling)
    await settler.acks.flush()
    assert await asyncio.gather(*settling) == ["success"] * 3
    assert sends == [(3, False)]
    assert (await depth(broker))["completed"] == 3


async def test_completions_settled_during_a_call_wait_for_the_next(broker) -> None:
    first, second = await taken(broker, 2)
    settler = Settler(broker, WORKER, hooks(), unknown_type_max_age=60)
    in_call, release = asyncio.Event(), asyncio.Event()
    carried: list[list[str]] = []

    async def slow_fetch(completions: Completions, resent: bool):
        carried.append([c.attempt.task_id for c in completions.get("default", [])])
        in_call.set()
        await release.wait()
        return await broker.dequeue("default", 0, WORKER, 60, completions, resent)

    one = asyncio.ensure_future(settler.settle(first, success(1)))
    await until(settler.acks.waiting.is_set)
    call = asyncio.ensure_future(settler.acks.ride(slow_fetch))
    await in_call.wait()
    two = asyncio.ensure_future(settler.settle(second, success(2)))
    await until(settler.acks.waiting.is_set)
    release.set()
    await call
    assert await one == "success" and not two.done()
    await settler.acks.flush()
    assert await two == "success"
    assert carried == [[first.id]]


async def test_a_stale_fencing_token_is_refused_as_lease_lost(broker, inspector) -> None:
    (task,) = await taken(broker, 1, fence_offset=1)
    outcomes: list[tuple[str, str]] = []
    settler = Settler(broker, WORKER, hooks(outcome_hook(outcomes)), unknown_type_max_age=60)
    settling = asyncio.ensure_future(settler.settle(task, success(0)))
    await until(settler.acks.waiting.is_set)
    await settler.acks.flush()
    assert await settling == "lease_lost"
    assert outcomes == [(task.id, "lease_lost")]
    assert (await inspector.task(task.id)).state == "active"  # the lease holder's still


async def test_completions_linger_for_a_fetch_then_go_on_their_own(broker) -> None:
    (task,) = await taken(broker, 1)
    settler = Settler(broker, WORKER, hooks(), unknown_type_max_age=60)
    room = asyncio.Event()
    settling = asyncio.ensure_future(settler.settle(task, success(0)))
    await until(settler.acks.waiting.is_set)
    await settler.acks.wait_for_room(room, linger=0.05)  # no room for a fetch came: sent alone
    assert await settling == "success"
    room.set()
    await settler.acks.wait_for_room(room, linger=60)  # nothing waits: returns with the event


async def test_close_records_what_is_left(broker) -> None:
    tasks = await taken(broker, 2)
    settler = Settler(broker, WORKER, hooks(), unknown_type_max_age=60)
    settling = [asyncio.ensure_future(settler.settle(t, success(i)))
                for i, t in enumerate(tasks)]
    await until(settler.acks.waiting.is_set)
    await settler.acks.close(timeout=10)
    assert await asyncio.gather(*settling) == ["success"] * 2
    assert (await depth(broker))["completed"] == 2


async def test_close_gives_up_on_a_redis_that_stays_away(private_redis: RedisServer,
                                                         namespace: str, caplog) -> None:
    broker = Broker(private_redis.url, namespace)
    try:
        tasks = await taken(broker, 2)
        outcomes: list[tuple[str, str]] = []
        settler = Settler(broker, WORKER, hooks(outcome_hook(outcomes)), unknown_type_max_age=60)
        settling = [asyncio.ensure_future(settler.settle(t, success(i)))
                    for i, t in enumerate(tasks)]
        await until(settler.acks.waiting.is_set)
        private_redis.close()
        await settler.acks.close(timeout=0.5)
        assert await asyncio.gather(*settling) == ["unrecorded"] * 2
        assert sorted(outcomes) == sorted((t.id, "unrecorded") for t in tasks)
        assert "gave up recording 2 completion(s)" in caplog.text
        # after close nothing waits for Redis: a late failure is given up at once too
        late = Task(id="late", type="t", queue="default", raw_payload=b"0", raw_headers=b"",
                    retry_count=0, max_retry=0, timeout=60, retention=0,
                    attempt=AttemptState(fence=1))
        assert await settler.settle(late, Verdict("dead", error=ValueError("x"))) == \
            "unrecorded"
    finally:
        await broker.close()


async def test_direct_mode_sends_each_completion_at_once(broker) -> None:
    (task,) = await taken(broker, 1)
    settler = Settler(broker, WORKER, hooks(), unknown_type_max_age=60)
    settler.direct = True  # draining: no fetch loop carries completions any more
    assert await settler.settle(task, success(0)) == "success"
    assert (await depth(broker))["completed"] == 1



async def test_successes_settled_later_are_told_each_even_when_one_fails(broker, inspector
                                                                        ) -> None:
    """settle_later: no coroutine per task; each success is told when the call carrying it
    returns. One whose follow-up raises is logged, and the others of that call, and the
    call's own value, are not lost."""
    tasks = await taken(broker, 3)
    outcomes: list[tuple[str, str]] = []
    settler = Settler(broker, WORKER, hooks(outcome_hook(outcomes)), unknown_type_max_age=60)
    settled: list[str] = []

    def then(task: Task):
        def follow_up() -> None:
            if task is tasks[0]:
                raise RuntimeError("a follow-up that fails")
            settled.append(task.id)
        return follow_up

    assert all(settler.settle_later(t, success(i), then(t)) for i, t in enumerate(tasks))
    assert not settler.settle_later(tasks[0], Verdict("retry"), then(tasks[0]))  # settle()'s
    assert settler.acks.waiting.is_set() and outcomes == []

    async def fetch(completions: Completions, resent: bool):
        return await broker.dequeue("default", 1, WORKER, 60, completions, resent)

    fetched = await settler.acks.ride(fetch)
    assert fetched.tasks == []  # the call's own value
    assert settled == [tasks[1].id, tasks[2].id]
    assert sorted(outcomes) == sorted((t.id, "success") for t in tasks)
    assert (await depth(broker))["completed"] == 3
    settler.direct = True  # draining: each goes at once, through settle()
    assert not settler.settle_later(tasks[1], success(1), then(tasks[1]))


async def test_a_success_settled_later_tells_its_hooks_in_the_task_s_context(broker) -> None:
    """The outcome hooks of a success run when the fetch carrying it returns, in another
    task: they still see the contextvars of the task that ran (a middleware's)."""
    request = contextvars.ContextVar("request", default="none")
    seen: list[str] = []
    [task] = await taken(broker, 1)
    settler = Settler(broker, WORKER, hooks(lambda t, outcome, error: seen.append(request.get())),
                      unknown_type_max_age=60)

    async def attempt() -> None:  # the task's own asyncio task, as the worker runs it
        request.set("the task's")
        assert settler.settle_later(task, success(0), lambda: None)

    await asyncio.ensure_future(attempt())

    async def fetch(completions: Completions, resent: bool):
        return await broker.dequeue("default", 1, WORKER, 60, completions, resent)

    await settler.acks.ride(fetch)
    assert seen == ["the task's"]
