"""Every enqueue option, enqueue_many, and route defaults taken from the App."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from support import ended, redis_now_ms, wait_until

import obsq
from obsq.broker import GlobalKeys, QueueKeys
from obsq.broker.wire import LAYOUTS


async def test_queue_option_puts_the_task_on_that_queue(app, client, start_worker) -> None:
    ran: list[tuple[str, str]] = []

    @app.task("q")
    async def q(task: obsq.Task):
        ran.append((task.payload, task.queue))

    info = await client.enqueue("q", "to-critical", queue="critical")
    assert info.queue == "critical"
    await start_worker(queues={"default": 1})
    await client.enqueue("q", "to-default")
    await wait_until(lambda: ran == [("to-default", "default")])
    assert (await client.info(info.id)).state == "pending"  # nobody serves critical yet
    await start_worker(queues="critical")
    await wait_until(lambda: ("to-critical", "critical") in ran)


async def test_max_retry_option_overrides_the_default(app, client, start_worker) -> None:
    attempts: list[int] = []

    @app.task("fail", retry_delay=0)
    async def fail(task: obsq.Task):
        attempts.append(task.retry_count)
        assert task.max_retry == 2
        raise RuntimeError("always")

    await start_worker()
    info = await client.enqueue("fail", max_retry=2, retention=60)
    assert info.max_retry == 2
    with pytest.raises(obsq.TaskFailed):
        await client.result(info, timeout=10)
    assert attempts == [0, 1, 2]
    dead = await client.info(info.id)
    assert (dead.state, dead.retry_count, dead.max_retry) == ("dead", 2, 2)


async def test_timeout_option_reaches_the_task_and_is_enforced(app, client,
                                                               start_worker) -> None:
    seen: list[float] = []

    @app.task("slow", timeout=60)
    async def slow(task: obsq.Task):
        seen.append(task.timeout)
        await asyncio.sleep(30)

    await start_worker()
    info = await client.enqueue("slow", timeout=0.3, max_retry=0, retention=60)
    with pytest.raises(obsq.TaskFailed, match="TaskTimeout"):
        await client.result(info, timeout=10)
    assert seen == [0.3]


async def test_delay_and_eta_schedule_the_task(app, client, start_worker, raw_redis,
                                               namespace) -> None:
    """On Redis's clock: due exactly `delay` after Redis took the task, and never run
    before it is due."""
    ran: dict[str, int] = {}  # Redis's clock when each ran
    keys = QueueKeys(namespace, "default")

    @app.task("later")
    async def later(task: obsq.Task):
        ran[task.payload] = redis_now_ms(raw_redis)

    await start_worker()
    before = redis_now_ms(raw_redis)
    delayed = await client.enqueue("later", "delay", delay=1.0)
    after = redis_now_ms(raw_redis)
    eta = datetime.now(timezone.utc) + timedelta(seconds=1.0)
    at_eta = await client.enqueue("later", "eta", eta=eta)
    naive_past = await client.enqueue("later", "past-eta", eta=datetime(2000, 1, 1))
    # a timedelta is a length of time from now, as delay or eta (Celery's countdown)
    as_lengths = [await client.enqueue("later", f"timedelta {option}",
                                       **{option: timedelta(hours=1)})  # type: ignore[arg-type]
                  for option in ("delay", "eta")]
    for info_of_length in as_lengths:
        due_ms = int(raw_redis.hget(keys.task(info_of_length.id), "due"))
        assert info_of_length.state == "scheduled" and due_ms >= before + 3_599_000
    assert delayed.state == "scheduled" and at_eta.state == "scheduled"
    assert naive_past.state == "pending"
    info = await client.info(delayed.id)
    assert info.state == "scheduled" and info.next_run_at is not None
    due = {name: int(raw_redis.hget(keys.task(t.id), "due"))
           for name, t in (("delay", delayed), ("eta", at_eta))}
    assert before + 1000 <= due["delay"] <= after + 1000
    assert int(info.next_run_at.timestamp() * 1000) == due["delay"]
    await wait_until(lambda: len(ran) == 3, timeout=10)
    assert ran["delay"] >= due["delay"] and ran["eta"] >= due["eta"]  # never early
    assert ran["past-eta"] < ran["delay"]


async def test_unique_for_rejects_duplicates_for_its_whole_window(app, client, start_worker,
                                                           raw_redis, namespace) -> None:
    gate = asyncio.Event()

    @app.task("uniq")
    async def uniq(task: obsq.Task):
        await gate.wait()
        return task.payload

    first = await client.enqueue("uniq", {"n": 1}, unique_for=60, retention=60)
    with pytest.raises(obsq.DuplicateTask) as caught:
        await client.enqueue("uniq", {"n": 1}, unique_for=60)
    assert caught.value.existing_id == first.id
    # another payload, or another type, is not a duplicate
    other = await client.enqueue("uniq", {"n": 2}, unique_for=60, retention=60)
    assert other.id != first.id
    assert raw_redis.keys(QueueKeys(namespace, "default").prefix + "unique:*")

    await start_worker()
    with pytest.raises(obsq.DuplicateTask):  # still a duplicate while it runs
        await client.enqueue("uniq", {"n": 1}, unique_for=60)
    gate.set()
    assert await client.result(first, timeout=10) == {"n": 1}
    await client.result(other, timeout=10)
    # still a duplicate after it succeeded: the lock lasts unique_for, whatever the end
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("uniq", {"n": 1}, unique_for=60)


async def test_unique_lock_expires_after_unique_for(app, client) -> None:
    first = await client.enqueue("uniq", "x", unique_for=0.2)
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("uniq", "x", unique_for=0.2)

    async def enqueued_again():
        try:
            return await client.enqueue("uniq", "x", unique_for=0.2)
        except obsq.DuplicateTask:
            return None

    again = await wait_until(enqueued_again, timeout=5)
    assert again.id != first.id


async def test_task_id_conflict_raises_duplicate(app, client) -> None:
    info = await client.enqueue("t", 1, task_id="order-42")
    assert info.id == "order-42"
    with pytest.raises(obsq.DuplicateTask) as caught:
        await client.enqueue("t", 2, task_id="order-42")
    assert caught.value.existing_id == "order-42"
    stored = await client.info("order-42")
    assert stored.payload == 1  # the first one was not overwritten


async def test_retention_keeps_the_result_and_without_it_the_task_is_gone(
        app, client, start_worker, raw_redis, namespace) -> None:
    ran: list[str] = []

    @app.task("double")
    async def double(task: obsq.Task):
        ran.append(task.id)
        return task.payload * 2

    await start_worker()
    kept = await client.enqueue("double", 21, retention=60)
    await wait_until(lambda: raw_redis.zscore(QueueKeys(namespace, "default").completed, kept.id))
    info = await client.info(kept.id)
    assert (info.state, info.result) == ("completed", 42)
    assert info.completed_at is not None
    ttl = raw_redis.pttl(QueueKeys(namespace, "default").task(kept.id))
    assert 60_000 < ttl <= 120_000  # retention plus a margin for the janitor

    gone = await client.enqueue("double", 1)
    key = QueueKeys(namespace, "default").task(gone.id)
    await wait_until(lambda: gone.id in ran and not raw_redis.exists(key))
    with pytest.raises(obsq.TaskNotFound):
        await client.info(gone.id)
    assert not raw_redis.zscore(QueueKeys(namespace, "default").completed, gone.id)


async def test_headers_reach_the_handler(app, client, start_worker) -> None:
    @app.task("h")
    async def h(task: obsq.Task):
        return task.headers

    await start_worker()
    info = await client.enqueue("h", headers={"tenant": "acme", "x-request-id": "r1"},
                                retention=60)
    assert info.headers == {"tenant": "acme", "x-request-id": "r1"}
    assert await client.result(info, timeout=10) == {"tenant": "acme", "x-request-id": "r1"}
    assert (await client.info(info.id)).headers == {"tenant": "acme", "x-request-id": "r1"}
    with pytest.raises(TypeError):
        await client.enqueue("h", headers={"n": 1})


async def test_enqueue_many_across_queues_flags_duplicates(app, client, start_worker,
                                                           raw_redis, namespace) -> None:
    ran: list[tuple[str, object]] = []

    @app.task("m")
    async def m(task: obsq.Task):
        ran.append((task.queue, task.payload))

    existing = await client.enqueue("m", "old", task_id="taken", queue="a")
    infos = await client.enqueue_many([
        obsq.Job("m", 1, queue="a"),
        obsq.Job("m", 2, queue="b"),
        obsq.Job("m", 3, queue="c", delay=0.2),
        obsq.Job("m", "dup-id", queue="a", task_id="taken"),
        obsq.Job("m", "u", queue="b", unique_for=60),
        obsq.Job("m", "u", queue="b", unique_for=60),
        obsq.Job("m", "fresh", queue="b", task_id="fresh-id"),
        obsq.Job("m", "fresh-again", queue="b", task_id="fresh-id"),
    ])
    assert [i.queue for i in infos] == ["a", "b", "c", "a", "b", "b", "b", "b"]
    assert [i.duplicate for i in infos] == [False, False, False, True, False, True, False,
                                            True]
    assert infos[3].id == existing.id
    assert infos[5].id == infos[4].id  # the id of the task holding the unique lock
    assert infos[6].id == "fresh-id"
    assert infos[2].state == "scheduled"
    assert raw_redis.smembers(GlobalKeys(namespace).queues) == {b"a", b"b", b"c"}

    await start_worker(queues="a,b,c")
    await wait_until(lambda: len(ran) == 6)
    assert sorted(ran, key=str) == sorted([("a", "old"), ("a", 1), ("b", 2), ("c", 3),
                                           ("b", "u"), ("b", "fresh")], key=str)
    assert await client.enqueue_many([]) == []


async def test_route_defaults_apply_when_the_client_has_the_app(app, client, start_worker,
                                                                redis_url, namespace) -> None:
    seen: list[tuple[str, int, float]] = []

    @app.task("routed", queue="reports", max_retry=1, timeout=5, retry_delay=0)
    async def routed(task: obsq.Task):
        seen.append((task.queue, task.max_retry, task.timeout))
        raise RuntimeError("no")

    info = await client.enqueue("routed")
    assert (info.queue, info.max_retry) == ("reports", 1)
    # explicit options still win over the route's
    explicit = await client.enqueue("routed", queue="default", max_retry=0, timeout=7)
    await start_worker(queues="reports,default")
    await wait_until(lambda: len(seen) == 3)
    assert sorted(seen) == [("default", 0, 7), ("reports", 1, 5), ("reports", 1, 5)]
    # the handler ran its last attempt: its failure is recorded a round trip later
    assert (await wait_until(lambda: ended(client, info.id))).state == "dead"
    assert (await client.info(explicit.id)).retry_count == 0

    # a client without the app knows no routes: the default queue
    async with obsq.Client(redis_url, namespace) as bare:
        plain = await bare.enqueue("routed")
    assert plain.queue == "default"


async def test_payloads_headers_and_names_round_trip_exactly(app, client, start_worker,
                                                             raw_redis, namespace) -> None:
    seen: dict[str, tuple] = {}

    @app.task("échange:données")
    async def handler(task: obsq.Task):
        seen[task.id] = (task.payload, task.headers, task.queue, task.type)
        return task.payload

    payloads = [
        None, True, 0, -1, 2**53 + 1, -(2**63), 1.5, 1e-300, "", "plain",
        "ünïcødé ✓ 😀 中文", "quote \" backslash \\ newline \n tab \t nul \x00",
        '{"looks": "like json"}', [1, [2, [3, [4]]]], {"nested": {"list": [{"a": None}]}},
        "x" * 1_000_000,
    ]
    jobs = [obsq.Job("échange:données", p, queue="file:à:traiter", task_id=f"id:{i}:ü",
                     headers={"clé": "välue ✓", "empty": ""}, retention=60)
            for i, p in enumerate(payloads)]
    infos = await client.enqueue_many(jobs)
    assert not any(i.duplicate for i in infos)
    await start_worker(queues="file:à:traiter")
    for i, p in enumerate(payloads):
        assert await client.result(infos[i], timeout=10) == p
        assert seen[f"id:{i}:ü"] == (p, {"clé": "välue ✓", "empty": ""}, "file:à:traiter",
                                     "échange:données")
    stored = await client.info("id:15:ü")
    assert stored.payload == "x" * 1_000_000


async def test_enqueue_many_in_large_batches(app, client, start_worker, broker) -> None:
    done: set[int] = set()

    @app.task("n")
    async def n(task: obsq.Task):
        done.add(task.payload)

    jobs = [obsq.Job("n", i, queue="big" if i % 3 else "small") for i in range(2500)]
    infos = await client.enqueue_many(jobs)
    assert [i.queue for i in infos] == [j.queue for j in jobs]
    assert len({i.id for i in infos}) == 2500
    stats = await broker.queue_stats(["big", "small"])
    assert stats["big"].depth["pending"] + stats["small"].depth["pending"] == 2500
    await start_worker(queues="big,small", concurrency=20)
    await wait_until(lambda: len(done) == 2500, timeout=30)


async def test_producer_hooks_wrap_every_write(app, client, start_worker) -> None:
    calls: list[str] = []

    @client.use
    async def outer(messages, call_next):
        calls.append(f"outer {len(messages)}")
        for m in messages:
            assert m.id  # ids are known before the write
            m.headers["trace"] = f"t-{m.id}"
        infos = await call_next(messages)
        calls.append("outer done")
        return infos

    @client.use
    async def inner(messages, call_next):
        calls.append("inner")
        return await call_next(messages)

    @app.task("h")
    async def h(task: obsq.Task):
        return task.headers["trace"]

    await start_worker()
    info = await client.enqueue("h", retention=60)
    assert await client.result(info, timeout=10) == f"t-{info.id}"
    await client.enqueue_many([obsq.Job("h"), obsq.Job("h")])
    assert calls == ["outer 1", "inner", "outer done", "outer 2", "inner", "outer done"]


@pytest.mark.parametrize("key", ['tenant-é"\\x', "ключ [1]", "😀 a b"])
async def test_keys_with_quotes_and_any_script_are_stored_as_given(client, broker,
                                                                   key: str) -> None:
    """The rarer options travel to enqueue.lua as one JSON field: quotes, backslashes and
    any script come out in Redis exactly as given."""
    info = await client.enqueue("t", 1, fairness_key=key, ordering_key=key, priority=3)
    fields, _ = await broker.task_fields(info.queue, info.id)
    assert (fields[b"fk"].decode(), fields[b"ordk"].decode(), fields[b"pri"]) == (
        key, key, b"3")


# Each of enqueue.lua's rarer options (wire.py's `rare`) as a Job gives it, and the field of
# the task hash that shows it was applied
RARER_OPTIONS = {
    "own": ({"task_id": "chosen-id"}, b"own"),
    "binary": ({"payload": b"\x00raw"}, b"bin"),
    "unique": ({"unique_for": 30}, b"uniq"),
    "ordering": ({"ordering_key": "o"}, b"ordk"),
    "priority": ({"priority": 4}, b"pri"),
    "expires": ({"expires": 60}, b"exp"),
    "debounce": ({"debounce_key": "d", "debounce": 5}, b"dbk"),
    "fairness": ({"fairness_key": "tenant"}, b"fk"),
}


def test_every_rarer_option_is_listed_here() -> None:
    packed = set(LAYOUTS["enqueue"].packed["rare"])
    listed = set(RARER_OPTIONS) | {"unique_for", "debounce_key", "debounce_max"}
    assert packed == listed


@pytest.mark.parametrize("option", sorted(RARER_OPTIONS))
async def test_a_batch_with_one_rarer_option_is_written_whole(client, broker,
                                                              option: str) -> None:
    """A batch none of whose tasks gives a rarer option goes to enqueue.lua's plain variant,
    which has not their helpers; one task that gives any sends the whole batch to the full
    script, and every task of it is written as asked."""
    given, field = RARER_OPTIONS[option]
    plain, rare = client.prepare([obsq.Job("t", "plain"),
                                  obsq.Job("t", **{"payload": "rare", **given})])
    assert broker.enqueue_call("default", [plain])[0] == "enqueue_plain"
    assert broker.enqueue_call("default", [plain, rare])[0] == "enqueue"
    infos = await client.enqueue_many([obsq.Job("t", "before"),
                                       obsq.Job("t", **{"payload": "rare", **given}),
                                       obsq.Job("t", "after")])
    assert not any(info.duplicate or info.debounced for info in infos), infos
    for info in infos:
        fields, _ = await broker.task_fields(info.queue, info.id)
        assert (field in fields) == (info.id == infos[1].id), (info, fields)
