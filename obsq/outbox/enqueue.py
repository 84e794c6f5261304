"""The producer's side of the outbox: a task written as a row in the caller's own database
transaction, so it exists exactly when the transaction's other writes do. A rolled-back
transaction leaves no row and so no task; a committed one leaves a row the relay moves to
Redis however soon the producer dies after its commit.

The task is checked as a Client checks it (obsq.producer.enqueue.JobChecks, with the App's
route defaults when given the App): a bad option raises at the call and nothing is written.
On PostgreSQL the same statement notifies the relay (NOTIFY is delivered at commit and
dropped by a rollback), so the relay starts moving it at once."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, overload

from opentelemetry import propagate
from sqlalchemy import Connection, Engine, Executable, MetaData, Table, func, insert, select
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
)
from sqlalchemy.orm import Session, scoped_session

from obsq.app import App, Hooks
from obsq.outbox.table import DEFAULT_TABLE, outbox_table, row_of
from obsq.producer.enqueue import JobChecks
from obsq.task import Job

SyncTarget = Connection | Session | scoped_session[Session]
AsyncTarget = AsyncConnection | AsyncSession | async_scoped_session[AsyncSession]
SYNC_TARGETS = (Connection, Session, scoped_session)
ASYNC_TARGETS = (AsyncConnection, AsyncSession, async_scoped_session)


class Outbox:
    def __init__(self, engine: Engine | AsyncEngine, *, table_name: str = DEFAULT_TABLE,
                 app: App | None = None, metadata: MetaData | None = None,
                 notify: bool = True) -> None:
        """`engine`: the application's (sync or async); `app`: route defaults (queue,
        max_retry, timeout, priority, payload limit) and the types it runs, as a Client
        given it; `metadata`: the application's, for its migrations to hold the table (a
        table of that name there already is used); `notify`: on PostgreSQL, wake the relay
        at each commit (LISTEN/NOTIFY), else it finds rows by polling."""
        self.engine = engine
        self.table_name = table_name
        metadata = metadata if metadata is not None else MetaData()
        existing = metadata.tables.get(table_name)
        self.table: Table = existing if existing is not None else outbox_table(metadata,
                                                                               table_name)
        self.checks = JobChecks(app, Hooks("refusal hook"))
        self.notifies = notify and engine.dialect.name == "postgresql"

    def create_table(self) -> None:
        """Create the table unless it exists (a sync engine; see create_table_async)."""
        if isinstance(self.engine, AsyncEngine):
            raise TypeError("an async engine: await outbox.create_table_async()")
        self.table.create(self.engine, checkfirst=True)

    async def create_table_async(self) -> None:
        """Create the table unless it exists, through an async engine."""
        if not isinstance(self.engine, AsyncEngine):
            raise TypeError("a sync engine: outbox.create_table()")
        async with self.engine.begin() as conn:
            await conn.run_sync(self.table.create, checkfirst=True)

    @overload
    def enqueue(self, conn: SyncTarget, task_type: str, payload: Any = None, *,
                queue: str | None = None, max_retry: int | None = None,
                timeout: float | None = None, delay: float | timedelta | None = None,
                eta: datetime | timedelta | None = None,
                unique_for: float | timedelta | None = None, task_id: str | None = None,
                retention: float | timedelta | None = None,
                headers: dict[str, str] | None = None, ordering_key: str | None = None,
                priority: int | None = None,
                expires: float | timedelta | datetime | None = None,
                fairness_key: str | None = None) -> str: ...

    @overload
    def enqueue(self, conn: AsyncTarget, task_type: str, payload: Any = None, *,
                queue: str | None = None, max_retry: int | None = None,
                timeout: float | None = None, delay: float | timedelta | None = None,
                eta: datetime | timedelta | None = None,
                unique_for: float | timedelta | None = None, task_id: str | None = None,
                retention: float | timedelta | None = None,
                headers: dict[str, str] | None = None, ordering_key: str | None = None,
                priority: int | None = None,
                expires: float | timedelta | datetime | None = None,
                fairness_key: str | None = None) -> Awaitable[str]: ...

    def enqueue(self, conn: SyncTarget | AsyncTarget, task_type: str, payload: Any = None, *,
                queue: str | None = None, max_retry: int | None = None,
                timeout: float | None = None, delay: float | timedelta | None = None,
                eta: datetime | timedelta | None = None,
                unique_for: float | timedelta | None = None, task_id: str | None = None,
                retention: float | timedelta | None = None,
                headers: dict[str, str] | None = None, ordering_key: str | None = None,
                priority: int | None = None,
                expires: float | timedelta | datetime | None = None,
                fairness_key: str | None = None) -> str | Awaitable[str]:
        """Write the task in `conn`'s transaction (a Connection or Session, scoped or not,
        or their async kinds: then await the call) and return the id it will have in Redis.
        The options are Client.enqueue's (but debounce, which names a task by its key, not
        its id); ValueError/TypeError (UnknownTaskType) before anything is written. The
        task is enqueued once the transaction commits; its delay and expiry count from
        now."""
        headers = dict(headers or {})
        propagate.inject(headers)  # the trace of the request that enqueued it goes on
        job = Job(task_type, payload, queue=queue, max_retry=max_retry, timeout=timeout,
                  delay=delay, eta=eta, unique_for=unique_for, task_id=task_id,
                  retention=retention, headers=headers, ordering_key=ordering_key,
                  priority=priority, expires=expires, fairness_key=fairness_key)
        now = time.time()
        message = self.checks.prepare([job], now)[0]
        statement = self._insert(row_of(message, now))
        if isinstance(conn, ASYNC_TARGETS):
            return self._write_async(conn, statement, message.id)
        if not isinstance(conn, SYNC_TARGETS):  # nothing else is known to write in it
            raise TypeError(f"outbox.enqueue writes in a Connection or Session (or their "
                            f"async kinds), got {type(conn).__name__}")
        conn.execute(statement)
        return message.id

    def _insert(self, row: dict[str, Any]) -> Executable:
        """The row's INSERT; on PostgreSQL with the relay's NOTIFY in the same statement."""
        statement = insert(self.table).values(row)
        if not self.notifies:
            return statement
        inserted = statement.returning(self.table.c.id).cte("inserted")
        return select(func.pg_notify(self.table_name, "")).select_from(inserted)

    @staticmethod
    async def _write_async(conn: AsyncTarget, statement: Executable, task_id: str) -> str:
        await conn.execute(statement)
        return task_id
