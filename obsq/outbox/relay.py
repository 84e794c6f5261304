"""The relay: committed outbox rows moved to Redis in the order of their ids, a batch at a
time, each row deleted only once Redis has its task.

A batch is read in one short transaction, sent with one Client.enqueue_many, and its rows
deleted in another: no database transaction stays open while Redis is asked. A relay
killed between Redis's reply and the DELETE sends those rows again when it (or another)
starts; each carries the task id chosen at enqueue, which Redis refuses while the task
exists and for the dedup window after it ended (docs/internals/dedup.md), so the second
send enqueues nothing and the rows go. Nothing is lost (a row goes only after Redis
replied) and nothing is doubled.

One relay moves a table's rows at a time, so they reach Redis in id order: on PostgreSQL
the relay that holds the table's advisory lock (obsq/outbox/wakeup.py), the others waiting
to take over. Ids are given at insert, not commit: a row whose transaction commits after a
later id's was relayed goes after it. On SQLite run one relay per database (a second one
would only send rows twice, which Redis refuses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    Row,
    Table,
    create_engine,
    delete,
    func,
    make_url,
    select,
)

from obsq.outbox.table import DEFAULT_TABLE, job_of, outbox_table
from obsq.outbox.wakeup import Wakeup, wakeup_for
from obsq.producer.client import Client

log = logging.getLogger("obsq.outbox")

BATCH = 500  # rows a batch moves at most
POLL_INTERVAL = 0.5  # seconds between looks for rows when no notification wakes the relay
RETRY_AFTER = (0.5, 30.0)  # a failed batch is tried again after this, doubling to the second
COUNT_INTERVAL = 1.0  # seconds between counts of the rows waiting (the gauges)


@dataclass
class Backlog:
    """The rows waiting, as last counted: how many, and when the oldest was enqueued."""

    rows: int = 0
    oldest: float | None = None  # UNIX seconds
    counted_at: float = float("-inf")  # monotonic

    def age(self) -> float:
        return max(time.time() - self.oldest, 0.0) if self.oldest is not None else 0.0


def sync_engine(database_url: str) -> Engine:
    """A sync engine for the relay from an application's URL (an async driver's too):
    PostgreSQL through psycopg, SQLite through the standard library."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    elif url.get_backend_name() == "sqlite":
        url = url.set(drivername="sqlite")
    return create_engine(url, pool_pre_ping=True)


class Relay:
    def __init__(self, database: str | Engine, client: Client, *,
                 table_name: str = DEFAULT_TABLE, batch: int = BATCH,
                 poll_interval: float = POLL_INTERVAL) -> None:
        """`database`: a URL or a sync engine; `client`: the Client the tasks are enqueued
        through (its namespace theirs)."""
        if batch < 1:
            raise ValueError(f"batch must be 1 or more, got {batch}")
        self.engine = sync_engine(database) if isinstance(database, str) else database
        self.client = client
        self.table: Table = outbox_table(MetaData(), table_name)
        self.batch = batch
        self.poll_interval = poll_interval
        self.relayed = 0  # rows moved by this relay
        self.backlog = Backlog()
        self.wakeup: Wakeup = wakeup_for(self.engine, table_name)
        self.failure: str | None = None  # the last batch's error, until one succeeds
        self._stopping = asyncio.Event()
        # the database calls, one at a time, on a thread of their own: beside a worker, its
        # default executor's threads may all be busy with an App's blocking work
        self._database = ThreadPoolExecutor(1, thread_name_prefix="obsq-outbox")

    def problem(self) -> str | None:
        """What keeps the relay from moving rows (its readiness), or None."""
        return self.failure

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Move rows until stop(): at once while full batches come, else when woken (a
        notification) or after the poll interval; a failed batch again after a pause."""
        retry = RETRY_AFTER[0]
        async with self.wakeup:
            while not self._stopping.is_set():
                if not await self.wakeup.lead(self._stopping, self.poll_interval):
                    self.backlog = Backlog()  # the leader's gauges tell the rows waiting
                    continue  # another relay leads: this one waits to take over
                self.wakeup.clear()  # a notification from now on wakes the next wait
                try:
                    moved = await self.relay_batch()
                    retry, self.failure = RETRY_AFTER[0], None
                except Exception as exc:
                    self.failure = f"the last batch failed: {exc!r}"
                    log.exception("outbox %s: a batch failed; its rows stay, tried again in "
                                  "%.1f s", self.table.name, retry)
                    await self._sleep(retry)
                    retry = min(retry * 2, RETRY_AFTER[1])
                    continue
                if moved < self.batch:
                    await self.wakeup.wait(self._stopping, self.poll_interval)

    async def relay_batch(self) -> int:
        """Move one batch of the oldest rows; returns how many were moved."""
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(self._database, self._read)
        if rows:
            jobs = [job_of(r.task_id, r.type, r.payload, r.options) for r in rows]
            await self.client.enqueue_many(jobs)  # a duplicate: sent before, and kept
            await loop.run_in_executor(self._database, self._delete, [r.id for r in rows])
            self.relayed += len(rows)
        return len(rows)

    def _read(self) -> Sequence[Row]:
        t = self.table
        with self.engine.connect() as conn:
            self._count(conn)
            return conn.execute(select(t.c.id, t.c.task_id, t.c.type, t.c.payload,
                                       t.c.options).order_by(t.c.id).limit(self.batch)).all()

    def _delete(self, ids: list[int]) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(self.table).where(self.table.c.id.in_(ids)))

    def _count(self, conn: Connection) -> None:
        """Count the rows waiting, at most every COUNT_INTERVAL (a count reads them all)."""
        now = time.monotonic()
        if now - self.backlog.counted_at < COUNT_INTERVAL:
            return
        t = self.table
        rows, oldest = conn.execute(select(func.count(), func.min(t.c.enqueued_at))).one()
        self.backlog = Backlog(rows, oldest, now)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
