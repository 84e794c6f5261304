"""The transactional outbox on real databases (a private PostgreSQL, SQLite) and a real
Redis: a task exists exactly when its transaction committed, with the options it was given,
its id the one enqueue returned; the relay moves rows in order, each once, and a second
send of a row (a relay that died before its DELETE) enqueues nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import obsq
from obsq.broker import QueueKeys
from obsq.outbox import Outbox, Relay
from obsq.outbox.metrics import watch_relay
from obsq.outbox.relay import sync_engine


@pytest.fixture
async def relay_client(redis_url: str, namespace: str) -> AsyncIterator[obsq.Client]:
    client = obsq.Client(redis_url, namespace=namespace)
    yield client
    await client.close()


def outbox_of(database_url: str, table_name: str, app: obsq.App | None = None) -> Outbox:
    outbox = Outbox(sync_engine(database_url), table_name=table_name, app=app)
    outbox.create_table()
    return outbox


def waiting(outbox: Outbox) -> int:
    with outbox.engine.connect() as conn:  # type: ignore[union-attr]
        return conn.scalar(select(func.count()).select_from(outbox.table)) or 0


async def test_a_committed_row_becomes_its_task_with_its_options(
        database_url: str, table_name: str, relay_client: obsq.Client) -> None:
    outbox = outbox_of(database_url, table_name)
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        plain = outbox.enqueue(conn, "email:send", {"to": "a@b.c"})
        chosen = outbox.enqueue(conn, "report:build", b"\x00raw", queue="reports",
                                priority=7, delay=3600, headers={"tenant": "7"},
                                max_retry=2, timeout=9, retention=60, task_id="report-1")
    assert chosen == "report-1"
    relay = Relay(database_url, relay_client, table_name=table_name)
    assert await relay.relay_batch() == 2
    assert waiting(outbox) == 0

    first = await relay_client.info(plain)
    assert (first.type, first.queue, first.state) == ("email:send", "default", "pending")
    second = await relay_client.info("report-1")
    assert (second.queue, second.state, second.priority, second.max_retry) == (
        "reports", "scheduled", 7, 2)
    assert second.headers["tenant"] == "7"


async def test_a_rolled_back_transaction_leaves_no_task(
        database_url: str, table_name: str, relay_client: obsq.Client) -> None:
    outbox = outbox_of(database_url, table_name)
    with Session(outbox.engine) as session:  # type: ignore[arg-type]
        task_id = outbox.enqueue(session, "email:send", {"to": "x"})
        session.rollback()
    assert waiting(outbox) == 0
    assert await Relay(database_url, relay_client, table_name=table_name).relay_batch() == 0
    with pytest.raises(obsq.TaskNotFound):
        await relay_client.info(task_id)


@pytest.mark.parametrize("options", [{"priority": 12}, {"delay": -1},
                                     {"delay": 1, "eta": 5.0}, {"queue": "bad queue"},
                                     {"headers": {"x": 1}}])
def test_a_bad_option_fails_at_the_call_and_writes_nothing(
        sqlite_url: str, table_name: str, options: dict[str, object]) -> None:
    outbox = outbox_of(sqlite_url, table_name)
    with outbox.engine.begin() as conn, pytest.raises((ValueError, TypeError)):  # type: ignore[union-attr]
        outbox.enqueue(conn, "email:send", {}, **options)  # type: ignore[arg-type]
    assert waiting(outbox) == 0


def test_the_app_gives_route_defaults_and_refuses_unknown_types(
        sqlite_url: str, table_name: str) -> None:
    app = obsq.App()

    @app.task("email:send", queue="mail", priority=3)
    async def send(task: obsq.Task) -> None: ...

    outbox = outbox_of(sqlite_url, table_name, app)
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        outbox.enqueue(conn, "email:send", {})
        with pytest.raises(obsq.UnknownTaskType):
            outbox.enqueue(conn, "email:sned", {})
    with outbox.engine.connect() as conn:  # type: ignore[union-attr]
        [options] = conn.scalars(select(outbox.table.c.options)).all()
    assert '"queue":"mail"' in options and '"priority":3' in options


async def test_rows_reach_redis_in_id_order_in_batches(
        database_url: str, table_name: str, relay_client: obsq.Client,
        raw_redis: object, namespace: str) -> None:
    outbox = outbox_of(database_url, table_name)
    ids = []
    for n in range(25):
        with outbox.engine.begin() as conn:  # type: ignore[union-attr]
            ids.append(outbox.enqueue(conn, "step", {"n": n}, queue="ordered"))
    relay = Relay(database_url, relay_client, table_name=table_name, batch=10)
    assert [await relay.relay_batch() for _ in range(4)] == [10, 10, 5, 0]
    pending = raw_redis.lrange(f"{namespace}:{{ordered}}:pending", 0, -1)  # type: ignore[attr-defined]
    assert [p.decode() for p in reversed(pending)] == ids  # LPUSH: the first is last


async def test_a_row_sent_again_after_a_lost_delete_enqueues_nothing(
        database_url: str, table_name: str, relay_client: obsq.Client,
        monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = outbox_of(database_url, table_name)
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        task_ids = [outbox.enqueue(conn, "once", {"n": n}, queue="once") for n in range(3)]
    relay = Relay(database_url, relay_client, table_name=table_name)

    def died_before_delete(ids: list[int]) -> None:
        raise ConnectionError("the relay died before its DELETE")

    monkeypatch.setattr(relay, "_delete", died_before_delete)
    with pytest.raises(ConnectionError):
        await relay.relay_batch()
    assert waiting(outbox) == 3  # Redis has them, the rows stay
    monkeypatch.undo()
    assert await relay.relay_batch() == 3
    assert waiting(outbox) == 0
    stats = await relay_client.broker.queue_stats(["once"])
    assert stats["once"].depth["pending"] == 3
    for task_id in task_ids:
        assert (await relay_client.info(task_id)).state == "pending"


async def test_async_connections_and_sessions_write_in_their_transaction(
        postgres_url: str, table_name: str, relay_client: obsq.Client) -> None:
    engine = create_async_engine(postgres_url)
    outbox = Outbox(engine, table_name=table_name)
    await outbox.create_table_async()
    async with engine.begin() as conn:
        by_connection = await outbox.enqueue(conn, "email:send", {"via": "connection"})
    async with AsyncSession(engine) as session:
        async with session.begin():
            by_session = await outbox.enqueue(session, "email:send", {"via": "session"})
        await outbox.enqueue(session, "email:send", {"via": "rolled back"})
        await session.rollback()
    await engine.dispose()
    relay = Relay(postgres_url, relay_client, table_name=table_name)
    assert await relay.relay_batch() == 2
    for task_id in (by_connection, by_session):
        assert (await relay_client.info(task_id)).type == "email:send"


async def test_a_notification_wakes_the_relay_on_postgresql(
        postgres_url: str, table_name: str, relay_client: obsq.Client) -> None:
    """The relay polls only every 60 s here: the commit's NOTIFY is what moves the row."""
    outbox = outbox_of(postgres_url, table_name)
    relay = Relay(postgres_url, relay_client, table_name=table_name, poll_interval=60)
    running = asyncio.ensure_future(relay.run())
    try:
        for _ in range(100):
            if relay.wakeup.leading:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # it leads, and waits
        with outbox.engine.begin() as conn:  # type: ignore[union-attr]
            task_id = outbox.enqueue(conn, "wake", {})
        for _ in range(100):
            if relay.relayed:
                break
            await asyncio.sleep(0.1)
        assert relay.relayed == 1
        assert (await relay_client.info(task_id)).state == "pending"
    finally:
        relay.stop()
        await running


async def test_two_relays_on_postgresql_move_each_row_once(
        postgres_url: str, table_name: str, redis_url: str, namespace: str) -> None:
    outbox = outbox_of(postgres_url, table_name)
    clients = [obsq.Client(redis_url, namespace=namespace) for _ in range(2)]
    relays = [Relay(postgres_url, c, table_name=table_name, batch=7) for c in clients]
    running = [asyncio.ensure_future(r.run()) for r in relays]
    try:
        for n in range(120):
            with outbox.engine.begin() as conn:  # type: ignore[union-attr]
                outbox.enqueue(conn, "shared", {"n": n}, queue="shared")
        for _ in range(200):
            if sum(r.relayed for r in relays) >= 120:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert sum(r.relayed for r in relays) == 120
        assert sorted(r.relayed for r in relays) == [0, 120]  # one leads
        stats = await clients[0].broker.queue_stats(["shared"])
        assert stats["shared"].depth["pending"] == 120
    finally:
        for r in relays:
            r.stop()
        await asyncio.gather(*running)
        for c in clients:
            await c.close()


async def test_the_metrics_count_the_rows_waiting_and_moved(
        database_url: str, table_name: str, relay_client: obsq.Client) -> None:
    outbox = outbox_of(database_url, table_name)
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        for n in range(5):
            outbox.enqueue(conn, "counted", {"n": n})
    relay = Relay(database_url, relay_client, table_name=table_name, batch=3)
    collector = watch_relay(relay)
    try:
        await relay.relay_batch()  # counted 5 waiting before it moved 3

        def sample(name: str) -> float | None:
            return REGISTRY.get_sample_value(name, {"table": table_name})

        assert sample("obsq_outbox_rows_waiting") == 5
        assert sample("obsq_outbox_relayed_total") == 3
        assert (sample("obsq_outbox_oldest_age_seconds") or 0) > 0
    finally:
        REGISTRY.unregister(collector)


def test_the_table_joins_an_applications_metadata_for_its_migrations() -> None:
    from sqlalchemy import MetaData

    from obsq.outbox import outbox_table

    metadata = MetaData()
    table = outbox_table(metadata)
    outbox = Outbox(create_engine("sqlite://"), metadata=metadata)
    assert outbox.table is table and metadata.tables["obsq_outbox"] is table


def test_a_scoped_session_writes_and_anything_else_is_refused(
        sqlite_url: str, table_name: str) -> None:
    from sqlalchemy.orm import scoped_session, sessionmaker

    outbox = outbox_of(sqlite_url, table_name)
    sessions = scoped_session(sessionmaker(outbox.engine))  # type: ignore[arg-type]
    outbox.enqueue(sessions, "email:send", {})
    sessions.commit()
    sessions.remove()
    with pytest.raises(TypeError, match="Connection or Session"):
        outbox.enqueue(outbox.engine, "email:send", {})  # type: ignore[call-overload]
    assert waiting(outbox) == 1


async def test_expiry_counts_from_the_enqueue_and_the_fairness_key_goes_along(
        database_url: str, table_name: str, relay_client: obsq.Client, app: obsq.App,
        start_worker, raw_redis, namespace: str) -> None:
    """A row's expiry is counted from the transaction's enqueue, not from the relay's send:
    one that passed while it waited for the relay ends dead with TaskExpired, never run;
    the fairness key reaches the task."""
    ran: list[str] = []

    @app.task("report:build")
    async def build(task: obsq.Task) -> None:
        ran.append(task.id)

    outbox = outbox_of(database_url, table_name, app)
    with outbox.engine.begin() as conn:  # type: ignore[union-attr]
        late = outbox.enqueue(conn, "report:build", 1, expires=0.2, retention=60)
        keyed = outbox.enqueue(conn, "report:build", 2, fairness_key="tenant-7",
                               expires=600, retention=60)
    await asyncio.sleep(0.4)  # the relay comes after the first one's expiry
    assert await Relay(database_url, relay_client, table_name=table_name).relay_batch() == 2
    assert raw_redis.hget(QueueKeys(namespace, "default").task(keyed), "fk") == b"tenant-7"
    await start_worker()
    with pytest.raises(obsq.TaskExpired):
        await relay_client.result(late, timeout=10)
    await relay_client.result(keyed, timeout=10)
    assert ran == [keyed]
