"""Fan-out events in one worker: a copy per subscriber, ids and headers, a publish sent
again, no subscriber, bad names, and the keys of a queue named events."""

from __future__ import annotations

import logging

import pytest
from support import wait_until

import obsq
from obsq.broker import EventKeys, QueueKeys
from obsq.inspection.inspector import Inspector

from .helpers import collides, queue_key_names


async def test_each_subscriber_gets_its_copy(app, redis_url, namespace, start_worker,
                                             caplog) -> None:
    got: list[tuple[str, str, dict]] = []

    @app.subscribe("order.created", name="billing")
    async def billing(task: obsq.Task) -> None:
        got.append(("billing", task.type, dict(task.headers)))

    @app.subscribe("order.created", name="email", queue="mail")
    async def email(task: obsq.Task) -> None:
        got.append(("email", task.payload["order"], dict(task.headers)))

    producer = obsq.Client(redis_url, namespace=namespace)  # without the App
    try:
        with caplog.at_level(logging.WARNING, "obsq"):
            assert await producer.publish("order.created", {"order": 0}) == []
            assert await producer.publish("order.created", {"order": 0}) == []
        assert caplog.text.count("no live subscriber") == 1
        await start_worker()
        async with Inspector(redis_url, namespace) as inspector:
            [worker] = await inspector.workers()
        assert worker.subscriptions == ["order.created@billing", "order.created@email"]
        infos = await producer.publish("order.created", {"order": 1}, event_id="ev-1")
        assert sorted((i.type, i.queue, i.id) for i in infos) == [
            ("order.created@billing", "default", "ev-1.billing"),
            ("order.created@email", "mail", "ev-1.email")]
        again = await producer.publish("order.created", {"order": 1}, event_id="ev-1")
        assert all(i.duplicate for i in again)
        await wait_until(lambda: len(got) == 2)
        by_name = {name: (value, headers) for name, value, headers in got}
        assert by_name["email"][0] == 1 and by_name["billing"][0] == "order.created@billing"
        assert by_name["billing"][1]["obsq-event-id"] == "ev-1"
        assert by_name["email"][1]["obsq-subscriber"] == "email"
        with pytest.raises(ValueError):
            await producer.publish("bad event", 1)
        with pytest.raises(ValueError):
            app.subscribe("order.created", name="a.b")
    finally:
        await producer.close()


def test_event_keys_do_not_collide_with_a_queue_named_events() -> None:
    """A queue named "events" shares the subscriptions' prefix: the keys of QueueKeys and
    those the queue scripts build must differ from EventKeys'."""
    queue, events = QueueKeys("ns", "events"), EventKeys("ns")
    assert queue.prefix == events.prefix
    taken = queue_key_names(skip_scripts=("subscribe.lua", "subscribers.lua"))
    mine = [events.subscribed[len(events.prefix):],
            events.subscribers("e")[len(events.prefix):-1]]
    assert mine == ["subscribed", "sub:"]
    assert [name for name in mine if collides(name, taken)] == []


def test_the_sync_client_groups_and_publishes(redis_url, namespace, raw_redis) -> None:
    with obsq.SyncClient(redis_url, namespace) as client:
        info = client.enqueue("rows:add", {"n": 1}, group="g", queue="rows")
        assert (info.state, client.info(info.id).state) == ("aggregating", "aggregating")
        subscribers = EventKeys(namespace).subscribers("paid")  # as a worker registers one
        raw_redis.zadd(subscribers, {"ledger rows": 2 ** 50})
        [copy] = client.publish("paid", b"\x00", event_id="p-1")
        assert (copy.id, copy.type, copy.queue) == ("p-1.ledger", "paid@ledger", "rows")
        assert client.info(copy.id).payload == b"\x00"
