"""The producer's concurrent core on its own, on a real Redis: the enqueue coalescer (calls
made while one is in flight share the next round trip) and the queue registry (concurrent
first uses of a queue share one registration). Each write is the broker's real one; a gate
in front of it holds a round trip in flight for as long as the test needs, so that who
shares which trip is decided by the test, not by timing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import depth

import obsq
from obsq.broker import Broker
from obsq.broker.records import Enqueued
from obsq.errors import BrokerError, BrokerTimeout
from obsq.producer import enqueue as coalescing
from obsq.producer.enqueue import REGISTER_AGAIN, EnqueueCoalescer, QueueRegistry
from obsq.task import Job, TaskMessage, build_message


def messages(count: int, queue: str = "default", **options: Any) -> list[TaskMessage]:
    return [build_message(Job("t", i, queue=queue, **options)) for i in range(count)]


class GatedWrites:
    """The broker's enqueue, each round trip recorded; the first `held` trips wait until
    the test opens theirs."""

    def __init__(self, broker: Broker, held: int = 1) -> None:
        self.broker = broker
        self.gates = [asyncio.Event() for _ in range(held)]
        self.sent: list[list[str]] = []  # the ids of each round trip, in order
        self.in_flight = 0

    def open(self, trip: int = 0) -> None:
        self.gates[trip].set()

    async def __call__(self, queue: str, batch: list[TaskMessage]) -> list[Enqueued]:
        trip = len(self.sent)
        self.sent.append([m.id for m in batch])
        self.in_flight += 1
        try:
            if trip < len(self.gates):
                await self.gates[trip].wait()
            return await self.broker.enqueue(queue, batch)
        finally:
            self.in_flight -= 1


def unbounded(write: Awaitable[list[Enqueued]]) -> Awaitable[list[Enqueued]]:
    return write


async def until(condition: Callable[[], bool]) -> None:
    """Let the other tasks of this loop run until `condition` holds."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the tasks of the loop never got there")


async def test_a_lone_call_goes_at_once_in_one_round_trip(broker: Broker) -> None:
    writes = GatedWrites(broker, held=0)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    batch = messages(3)
    assert await coalescer.enqueue("default", batch) == [Enqueued(True)] * 3
    assert writes.sent == [[m.id for m in batch]]
    assert (await depth(broker))["pending"] == 3


async def test_calls_made_while_one_is_in_flight_share_the_next_round_trip(broker) -> None:
    writes = GatedWrites(broker)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    later = [messages(2) for _ in range(20)]
    calls = [asyncio.ensure_future(coalescer.enqueue("default", batch)) for batch in later]
    await until(lambda: all(not c.done() for c in calls) and len(writes.sent) == 1)
    writes.open()
    assert await first == [Enqueued(True)]
    for call in calls:  # each caller gets the statuses of its own messages
        assert await call == [Enqueued(True)] * 2
    # two round trips for 21 calls: the first, then all that waited behind it, in order
    assert writes.sent[1] == [m.id for batch in later for m in batch]
    assert len(writes.sent) == 2
    assert (await depth(broker))["pending"] == 41


async def test_what_waits_goes_a_batch_a_round_trip(broker: Broker) -> None:
    writes = GatedWrites(broker)
    coalescer = EnqueueCoalescer(writes, 5, unbounded)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    calls_messages = [messages(3) for _ in range(4)]
    calls = [asyncio.ensure_future(coalescer.enqueue("default", batch))
             for batch in calls_messages]
    await asyncio.sleep(0)
    writes.open()
    await asyncio.gather(first, *calls)
    # no round trip carries more than a batch, and the messages go in the callers' order
    assert [len(ids) for ids in writes.sent] == [1, 5, 1, 5, 1]
    assert [i for ids in writes.sent[1:] for i in ids] == [
        m.id for call in calls_messages for m in call]
    assert (await depth(broker))["pending"] == 13


async def test_a_duplicate_in_a_shared_round_trip_is_told_to_its_own_caller(broker) -> None:
    writes = GatedWrites(broker)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    same = [asyncio.ensure_future(coalescer.enqueue("default", messages(1, task_id="same")))
            for _ in range(2)]
    await asyncio.sleep(0)
    writes.open()
    await first
    created, duplicate = [await call for call in same]
    assert created == [Enqueued(True)]
    assert [status.created for status in duplicate] == [False]


async def test_a_caller_that_gave_up_before_its_trip_is_not_sent(broker) -> None:
    writes = GatedWrites(broker)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    gone, kept = messages(1), messages(1)
    gives_up = asyncio.ensure_future(coalescer.enqueue("default", gone))
    stays = asyncio.ensure_future(coalescer.enqueue("default", kept))
    await asyncio.sleep(0)
    gives_up.cancel()
    writes.open()
    await first
    assert await stays == [Enqueued(True)]
    assert writes.sent[1] == [kept[0].id]
    assert (await depth(broker))["pending"] == 2


async def test_a_failed_shared_trip_fails_each_of_its_callers_and_frees_the_lane(
        broker: Broker) -> None:
    writes = GatedWrites(broker, held=2)

    async def bound(write: Awaitable[list[Enqueued]]) -> list[Enqueued]:
        try:
            return await asyncio.wait_for(write, 0.2)
        except asyncio.TimeoutError:
            raise BrokerError("enqueue", TimeoutError("no answer")) from None

    coalescer = EnqueueCoalescer(writes, 100, bound)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    calls = [asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
             for _ in range(3)]
    await asyncio.sleep(0)
    writes.open(0)
    assert await first == [Enqueued(True)]
    done, _ = await asyncio.wait(calls)  # their trip stays held: its bound ends it
    for call in done:
        with pytest.raises(BrokerError, match="no answer"):
            call.result()
    assert await coalescer.enqueue("default", messages(1)) == [Enqueued(True)]
    assert (await depth(broker))["pending"] == 2


async def test_a_trip_past_its_deadline_fails_the_callers_waiting_behind_it_at_once(
        broker: Broker) -> None:
    """Redis stopped answering: the callers waiting for the next trip get the timed-out
    trip's error with it, not one deadline more each; none of their tasks was sent."""
    writes = GatedWrites(broker, held=1)

    async def bound(write: Awaitable[list[Enqueued]]) -> list[Enqueued]:
        try:
            return await asyncio.wait_for(write, 0.3)
        except asyncio.TimeoutError:
            raise BrokerTimeout("enqueue", 0.3, "redis://stopped") from None

    coalescer = EnqueueCoalescer(writes, 100, bound)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    waiting = [asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
               for _ in range(3)]
    done, _ = await asyncio.wait([first, *waiting])
    ended = loop.time()
    for call in done:
        with pytest.raises(BrokerTimeout):
            call.result()
    assert ended - started < 0.55  # one deadline, not one for the first trip and another
    assert len(writes.sent) == 1  # the waiting callers' tasks were never sent
    writes.open(0)
    assert await coalescer.enqueue("default", messages(1)) == [Enqueued(True)]


async def test_queues_have_lanes_of_their_own(broker: Broker) -> None:
    writes = GatedWrites(broker, held=2)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    held = asyncio.ensure_future(coalescer.enqueue("a", messages(1, queue="a")))
    await until(lambda: writes.in_flight == 1)
    other = asyncio.ensure_future(coalescer.enqueue("b", messages(1, queue="b")))
    await until(lambda: writes.in_flight == 2)  # sent at once, not behind queue a's trip
    writes.open(1)
    assert await other == [Enqueued(True)]
    writes.open(0)
    assert await held == [Enqueued(True)]


async def test_close_cancels_the_callers_still_waiting(broker: Broker) -> None:
    writes = GatedWrites(broker, held=2)
    coalescer = EnqueueCoalescer(writes, 100, unbounded)
    first = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await until(lambda: writes.in_flight == 1)
    waiting = asyncio.ensure_future(coalescer.enqueue("default", messages(1)))
    await asyncio.sleep(0)
    writes.open(0)
    await first
    await until(lambda: writes.in_flight == 1)  # the waiting caller's trip, held
    await coalescer.close()
    await asyncio.wait([waiting])
    assert waiting.cancelled()
    assert (await depth(broker))["pending"] == 1


# -- the queue registry --------------------------------------------------------------------


class GatedRegister:
    """The broker's register_queues, each call recorded and held at `gate`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.gate = asyncio.Event()
        self.calls: list[set[str]] = []
        self.fail: Exception | None = None

    async def __call__(self, queues: set[str]) -> None:
        self.calls.append(set(queues))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        await self.broker.register_queues(queues)


async def test_concurrent_first_uses_of_a_queue_share_one_registration(broker) -> None:
    register = GatedRegister(broker)
    registry = QueueRegistry(register)
    calls = [asyncio.ensure_future(registry.ensure(["mail"])) for _ in range(10)]
    await until(lambda: len(register.calls) == 1)
    register.gate.set()
    fresh = await asyncio.gather(*calls)
    assert register.calls == [{"mail"}]
    assert fresh[0] == {"mail"} and all(f == set() for f in fresh[1:])
    assert "mail" in await broker.queues()
    assert await registry.ensure(["mail"]) == set()  # known: no call at all
    assert register.calls == [{"mail"}]


async def test_a_registration_underway_is_shared_and_only_new_queues_are_sent(broker) -> None:
    register = GatedRegister(broker)
    registry = QueueRegistry(register)
    first = asyncio.ensure_future(registry.ensure(["a", "b"]))
    await until(lambda: len(register.calls) == 1)
    second = asyncio.ensure_future(registry.ensure(["b", "c"]))
    await until(lambda: len(register.calls) == 2)
    assert register.calls == [{"a", "b"}, {"c"}]
    register.gate.set()
    assert await first == {"a", "b"} and await second == {"c"}
    assert {"a", "b", "c"} <= set(await broker.queues())


async def test_a_failed_registration_fails_its_callers_and_is_tried_again(broker) -> None:
    register = GatedRegister(broker)
    registry = QueueRegistry(register)
    register.fail = BrokerError("register", ConnectionError("Redis away"))
    calls = [asyncio.ensure_future(registry.ensure(["mail"])) for _ in range(3)]
    await until(lambda: len(register.calls) == 1)
    register.gate.set()
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        assert isinstance(outcome, BrokerError)
    assert not registry.known
    register.fail = None
    assert await registry.ensure(["mail"]) == {"mail"}
    assert set(registry.known) == {"mail"} and "mail" in await broker.queues()


async def test_a_caller_that_gives_up_does_not_cancel_the_others_registration(broker) -> None:
    register = GatedRegister(broker)
    registry = QueueRegistry(register)
    gives_up = asyncio.ensure_future(registry.ensure(["mail"]))
    await until(lambda: len(register.calls) == 1)
    stays = asyncio.ensure_future(registry.ensure(["mail"]))
    await asyncio.sleep(0)
    gives_up.cancel()
    register.gate.set()
    assert await stays == set()
    assert set(registry.known) == {"mail"} and "mail" in await broker.queues()


async def test_a_queue_is_registered_again_a_while_after(broker, monkeypatch) -> None:
    """A Redis restarted empty has lost the set of queues: each producer puts its queues
    back at their next use once REGISTER_AGAIN has passed, not only at their first."""
    register, clock = GatedRegister(broker), [100.0]
    register.gate.set()
    registry = QueueRegistry(register, now=lambda: clock[0])
    assert await registry.ensure(["mail"]) == {"mail"}
    clock[0] += REGISTER_AGAIN - 1
    assert await registry.ensure(["mail"]) == set()
    clock[0] += 1
    assert await registry.ensure(["mail", "sms"]) == {"mail", "sms"}
    assert register.calls == [{"mail"}, {"mail", "sms"}]


async def test_a_sync_client_registers_its_queues_again_after_redis_lost_them(
        redis_url, namespace, raw_redis, monkeypatch) -> None:
    """The SyncClient's enqueues in its caller's thread register through its Client's
    registry: once REGISTER_AGAIN has passed, a queue Redis forgot is put back."""
    monkeypatch.setattr(coalescing, "REGISTER_AGAIN", 0.2)
    client = obsq.SyncClient(redis_url, namespace)
    try:
        client.enqueue("t", 1)
        assert raw_redis.sismember(f"{namespace}:queues", "default")
        for key in raw_redis.scan_iter(match=f"{namespace}:*"):  # what a restart loses
            raw_redis.delete(key)
        await asyncio.sleep(0.3)
        client.enqueue("t", 2)
        assert raw_redis.sismember(f"{namespace}:queues", "default")
    finally:
        client.close()
