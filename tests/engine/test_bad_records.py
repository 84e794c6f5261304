"""Malformed records planted in Redis between good tasks, as a fault-injection run leaves
them: each costs only itself. Every good task runs exactly once, the bad record ends where
the durability guide says (the queue's junk, the dead set, the flows' junk) with its
reason, and the worker says so once at WARNING, never as an error each second."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable

import pytest
from support import wait_until

import obsq
from obsq import Job, chain
from obsq.broker import FlowKeys, GlobalKeys, QueueKeys
from obsq.broker.keys import KEY_NAMES

GOOD = 200
RUN_WITHIN = 30.0  # seconds for the good tasks: a second or two when nothing is lost


def _good_tasks(app: obsq.App) -> collections.Counter[object]:
    ran: collections.Counter[object] = collections.Counter()

    @app.task("good")
    async def good(task: obsq.Task) -> None:
        ran[task.payload] += 1

    return ran


async def _between_good_tasks(client: obsq.Client, plant: Callable[[], object],
                              priority: bool = False) -> object:
    """GOOD tasks (of priorities 0 to 2 with `priority`), the planted record in the middle."""
    def jobs(numbers: range) -> list[Job]:
        return [Job("good", n, priority=n % 3 if priority else None) for n in numbers]

    await client.enqueue_many(jobs(range(GOOD // 2)))
    planted = plant()
    await client.enqueue_many(jobs(range(GOOD // 2, GOOD)))
    return planted


async def _each_ran_once(ran: collections.Counter[object]) -> None:
    await wait_until(lambda: len(ran) >= GOOD, timeout=RUN_WITHIN, what="every good task ran")
    await asyncio.sleep(0.5)  # a task run twice would show by now: they take no time
    assert set(ran) == set(range(GOOD)) and set(ran.values()) == {1}, ran


def _said_once(caplog: pytest.LogCaptureFixture, *words: str) -> None:
    """One WARNING names the record, and obsq logged no error."""
    said = [r for r in caplog.records if all(w in r.getMessage() for w in words)]
    assert [r.levelno for r in said] == [logging.WARNING], [r.getMessage() for r in said]
    errors = [r.getMessage() for r in caplog.records
              if r.name.startswith("obsq") and r.levelno >= logging.ERROR]
    assert errors == []


def _junk(raw_redis, key: str, field: str) -> str:
    value = raw_redis.hget(key, field)
    assert value is not None, raw_redis.hgetall(key)
    return value.decode()


@pytest.mark.parametrize("level", [0, 5])
async def test_a_string_where_a_task_hash_belongs_is_set_aside(
        app, client, start_worker, raw_redis, namespace, caplog, level) -> None:
    """The dequeue popped a batch, failed on it (WRONGTYPE) and lost the good tasks popped
    with it; now it sets the record aside in the queue's junk and delivers the rest."""
    ran = _good_tasks(app)
    k = QueueKeys(namespace, "default")

    def plant() -> None:
        raw_redis.set(k.task("not-a-hash"), "a string")
        if level:
            raw_redis.sadd(k.levels, level)
        raw_redis.lpush(k.pending_of(level), "not-a-hash")

    await _between_good_tasks(client, plant, priority=bool(level))
    await start_worker()
    await _each_ran_once(ran)
    assert "is a string, not a task hash" in _junk(raw_redis, k.junk, "t:not-a-hash")
    assert raw_redis.get(k.task("not-a-hash")) == b"a string"  # kept to be looked at
    assert not raw_redis.hexists(k.active, "not-a-hash")
    _said_once(caplog, "not-a-hash", "junk")


async def test_a_priority_level_that_is_not_a_number_is_set_aside(
        app, client, start_worker, raw_redis, namespace, caplog) -> None:
    """Every dequeue failed on it: no task of the queue ran."""
    ran = _good_tasks(app)
    k = QueueKeys(namespace, "default")

    def plant() -> None:
        raw_redis.sadd(k.levels, "x")
        raw_redis.lpush(k.pending + ":x", "stray")

    await _between_good_tasks(client, plant, priority=True)
    await start_worker()
    await _each_ran_once(ran)
    assert b"x" not in raw_redis.smembers(k.levels)
    assert "priority 'x'" in _junk(raw_redis, k.junk, "pending:x")
    _said_once(caplog, "pending:x", "junk")


async def test_a_task_it_cannot_build_ends_dead_at_once_naming_the_field(
        app, client, start_worker, raw_redis, namespace, caplog) -> None:
    """Building it raised, which dropped its whole fetched batch: it came back every lease
    and never went dead. Now it alone ends dead, no retry spent, its handler never run."""
    ran = _good_tasks(app)
    k = QueueKeys(namespace, "default")

    async def plant() -> str:
        bad = await client.enqueue("good", "bad", max_retry=5)
        raw_redis.hset(k.task(bad.id), "opts", '{"retention": "x"}')
        return bad.id

    await client.enqueue_many([Job("good", n) for n in range(GOOD // 2)])
    bad_id = await plant()
    await client.enqueue_many([Job("good", n) for n in range(GOOD // 2, GOOD)])
    await start_worker()
    await _each_ran_once(ran)
    dead = await wait_until(lambda: _dead(client, bad_id), what="the bad task dead")
    assert "retention" in dead.error and "'x'" in dead.error, dead.error
    assert dead.retry_count == 0 and ran["bad"] == 0
    _said_once(caplog, bad_id, "retention")


async def _dead(client: obsq.Client, task_id: str) -> obsq.TaskInfo | None:
    info = await client.info(task_id)
    return info if info.state == "dead" else None


@pytest.mark.parametrize("where", ["retry", "lease", "dead"])
async def test_each_sweep_sets_aside_what_it_cannot_read(
        app, client, start_worker, raw_redis, namespace, caplog, where) -> None:
    """The forwarder (a due retry), the recoverer (an expired lease) and the janitor (a dead
    task past its keeping) failed on it every pass, and on every queue after it."""
    ran = _good_tasks(app)
    k = QueueKeys(namespace, "default")
    await client.enqueue("good", "due later", delay=1)

    def plant() -> None:
        raw_redis.set(k.task("not-a-hash"), "a string")
        raw_redis.zadd(getattr(k, where), {"not-a-hash": 1})
        if where == "lease":
            raw_redis.hset(k.active, "not-a-hash", "1:lost-worker")

    await _between_good_tasks(client, plant)
    await start_worker(dead_max_age=60)
    await _each_ran_once(ran)
    await wait_until(lambda: raw_redis.hexists(k.junk, "t:not-a-hash"), what="set aside")
    assert f"found in {where}" in _junk(raw_redis, k.junk, "t:not-a-hash")
    assert raw_redis.zscore(getattr(k, where), "not-a-hash") is None
    assert not raw_redis.hexists(k.active, "not-a-hash")
    await wait_until(lambda: ran["due later"] == 1, what="the forwarder went on")
    _said_once(caplog, "not-a-hash", "junk")


async def _between_good_flows(client: obsq.Client,
                              plant: Callable[[], Awaitable[obsq.FlowInfo]]
                              ) -> tuple[list[obsq.FlowInfo], obsq.FlowInfo]:
    """GOOD chains of two steps (payloads n, then GOOD + n), the planted flow in the
    middle: (the good flows, the planted one)."""
    def chains(numbers: range) -> list[obsq.Flow]:
        return [chain(Job("good", n), Job("good", GOOD + n)) for n in numbers]

    flows = [await client.enqueue(f) for f in chains(range(GOOD // 2))]
    planted = await plant()
    return flows + [await client.enqueue(f) for f in chains(range(GOOD // 2, GOOD))], planted


async def _each_flow_ran_once(client: obsq.Client, flows: list[obsq.FlowInfo],
                              ran: collections.Counter[object]) -> None:
    await asyncio.wait_for(asyncio.gather(*(client.result(f) for f in flows)), RUN_WITHIN)
    await asyncio.sleep(0.5)
    steps = {n for n in ran if isinstance(n, int)}
    assert steps == set(range(2 * GOOD)) and {ran[n] for n in steps} == {1}, ran


async def test_a_malformed_flow_costs_only_itself(app, client, start_worker, raw_redis,
                                                  namespace, caplog, monkeypatch) -> None:
    """One flow whose record does not parse, and an index entry that is no flow id, broke
    the sweep of every flow (an ERROR each second): a flow whose producer died before it
    launched its first steps never launched."""
    ran = _good_tasks(app)
    g = GlobalKeys(namespace)
    left_launching = await _left_launching(client, monkeypatch)

    async def plant() -> obsq.FlowInfo:
        unreadable = await client.enqueue(chain(Job("good", "never"), Job("good", "never")))
        bad = FlowKeys(namespace, unreadable.id)
        raw_redis.hset(bad.flow, "m:1", "{not json")
        raw_redis.hset(bad.flow, "s:1", "l")
        raw_redis.sadd(bad.launching, 1)
        for flow_id in (unreadable.id, b"\xff\xfe not a flow id", left_launching):
            raw_redis.zadd(g.flows, {flow_id: 1})
            raw_redis.zadd(g.flow_look, {flow_id: 0})  # all due at once, the bad ones first
        return unreadable

    flows, unreadable = await _between_good_flows(client, plant)
    await start_worker()
    await _each_flow_ran_once(client, flows, ran)
    assert await client.result(obsq.FlowInfo(left_launching, "running", [], 1),
                               timeout=RUN_WITHIN) is None
    junk = await wait_until(lambda: raw_redis.hlen(g.flow_junk) == 2 and raw_redis.hgetall(
        g.flow_junk), what="both set aside")
    assert b"m:1" in junk[unreadable.id.encode()], junk
    assert b"not a flow id" in junk[b"\xff\xfe not a flow id"], junk
    _said_once(caplog, unreadable.id, "junk")
    _said_once(caplog, "not a flow id", "junk")


async def _left_launching(client: obsq.Client, monkeypatch: pytest.MonkeyPatch) -> str:
    """A chain of two whose producer died before enqueueing its first step: its id."""
    async def killed(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError

    with monkeypatch.context() as patched:
        patched.setattr("obsq.producer.flow_client.launch", killed)
        with pytest.raises(asyncio.CancelledError):
            await client.enqueue(chain(Job("good", "first"), Job("good", "second")))
    _, [flow_id] = await client.broker.flow_page(0, 1)  # the latest written
    return flow_id


async def test_a_flow_field_that_does_not_parse_sets_its_flow_aside(
        app, client, start_worker, raw_redis, namespace, caplog) -> None:
    """Recording a step's end failed halfway in its flow's script, held up the queue's flow
    inbox until a retry passed over the half-recorded end, and left the flow stuck for good,
    unsaid. Now the flow is set aside and said once, and no other flow waits."""
    ran = _good_tasks(app)

    async def plant() -> obsq.FlowInfo:
        bad = await client.enqueue(chain(Job("good", "a"), Job("good", "b")))
        raw_redis.hset(FlowKeys(namespace, bad.id).flow, "left:1", "x")
        return bad

    flows, bad = await _between_good_flows(client, plant)
    await start_worker()
    await _each_flow_ran_once(client, flows, ran)
    g = GlobalKeys(namespace)
    await wait_until(lambda: raw_redis.hexists(g.flow_junk, bad.id), what="set aside")
    assert "left:1" in _junk(raw_redis, g.flow_junk, bad.id)
    assert ran["b"] == 0  # its later step never runs
    _said_once(caplog, bad.id, "junk")


async def test_a_step_ending_into_a_deleted_flow_is_said_once(
        app, client, start_worker, raw_redis, namespace, caplog) -> None:
    """The flow's hash deleted behind obsq's back while its steps run: the rest of its
    chain never runs, and the worker says so once (it said nothing)."""
    release = asyncio.Event()

    @app.task("wait")
    async def wait(task: obsq.Task) -> None:
        await release.wait()

    @app.task("after")
    async def after(task: obsq.Task) -> None:
        raise AssertionError("a step of a deleted flow ran")

    await start_worker(concurrency=4)
    flow = await client.enqueue(obsq.chord([Job("wait"), Job("wait")], Job("after")))
    await wait_until(lambda: _running(raw_redis, namespace) == 2, what="both members run")
    keys = FlowKeys(namespace, flow.id)
    raw_redis.delete(keys.flow, keys.results)
    release.set()
    g = GlobalKeys(namespace)
    await wait_until(lambda: raw_redis.hexists(g.flow_junk, flow.id), what="set aside")
    await wait_until(lambda: not raw_redis.llen(f"{namespace}:{{default}}:inbox:~flows"),
                     what="both ends read")
    assert "deleted" in _junk(raw_redis, g.flow_junk, flow.id)
    _said_once(caplog, flow.id, "never run")


def _running(raw_redis, namespace: str) -> int:
    return raw_redis.hlen(QueueKeys(namespace, "default").active)


@pytest.mark.parametrize("name", ["memory_budget", "wake"])
async def test_a_tampered_budget_or_wake_key_costs_no_enqueue(
        app, client, broker, start_worker, raw_redis, name: str) -> None:
    """The queue's memory budget (a number) and wake tokens (a list) are obsq's own caches: a
    string of junk in either is replaced by the next enqueue, which is written and answered
    as usual (not refused for ever, not written and then failed), and every task runs."""
    ran = _good_tasks(app)
    key = broker.keys("default").prefix + KEY_NAMES[name]
    await client.enqueue_many([Job("good", n) for n in range(GOOD // 2)])
    raw_redis.delete(key)
    raw_redis.set(key, "junk")
    infos = await client.enqueue_many([Job("good", n) for n in range(GOOD // 2, GOOD)])
    assert len({info.id for info in infos}) == GOOD // 2
    assert raw_redis.get(key).isdigit() if name == "memory_budget" else (
        raw_redis.type(key) == b"list")
    await start_worker()
    await _each_ran_once(ran)


@pytest.mark.parametrize("registry", ["queues", "partitions", "workers"])
async def test_a_junk_registry_does_not_stop_the_namespace(
        app, client, start_worker, raw_redis, namespace, caplog, registry: str) -> None:
    """The namespace's registries (its queues, their partition counts, its workers) are read
    before a worker starts and a producer's first enqueue: a string of junk in one reads as
    empty, said once, and registering replaces it (before, the worker did not start and
    every enqueue failed)."""
    caplog.set_level(logging.WARNING, logger="obsq")
    ran = _good_tasks(app)
    key = getattr(GlobalKeys(namespace), registry)
    raw_redis.set(key, "junk")
    await client.enqueue_many([Job("good", n) for n in range(GOOD)])
    await start_worker()
    await _each_ran_once(ran)
    if registry != "partitions":  # declared by workers of partitioned queues alone
        assert raw_redis.type(key) != b"string"
    if registry == "queues":  # the producer registered its queue before any read: no word
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    else:
        _said_once(caplog, key, "is not the registry")


@pytest.mark.parametrize("name", ["levels", "fair_ring", "fence", "lease", "active"])
async def test_a_queue_key_holding_junk_is_moved_aside_and_costs_no_task(
        app, client, broker, start_worker, raw_redis, caplog, name: str) -> None:
    """A key of the queue's own holding another type than obsq keeps there: the fetch that
    meets it moves it aside as found (`aside:<name>`, named in the junk), makes the set of
    levels or the ring of fairness keys again from what waits, and goes on. Before, junk in
    the fence, the leases or the active hash made every fetch lose the tasks it popped, and
    in the levels or the ring stopped the queue."""
    caplog.set_level(logging.WARNING, logger="obsq")
    ran = _good_tasks(app)
    # plain tasks, tasks of priority 2 (a pending list of their own, named in `levels`) and
    # tasks of two fairness keys (in the ring)
    await client.enqueue_many([
        Job("good", n, priority=2 if n % 3 == 1 else None,
            fairness_key=f"tenant-{n % 2}" if n % 3 == 2 else None) for n in range(GOOD)])
    keys = broker.keys("default")
    raw_redis.delete(keys.prefix + KEY_NAMES[name])
    raw_redis.set(keys.prefix + KEY_NAMES[name], "junk")
    await start_worker()
    await _each_ran_once(ran)
    aside = "aside:" + KEY_NAMES[name]
    assert raw_redis.get(keys.prefix + aside) == b"junk"  # kept as found
    assert "not a" in _junk(raw_redis, keys.junk, aside)
    _said_once(caplog, aside)
