"""The outbox table and what one row holds: a task checked and encoded at enqueue (a
TaskMessage), written as a row in the producer's transaction, read back by the relay as
the Job that enqueues it in Redis.

A row keeps the task's id, chosen at enqueue: the relay sends it as a producer-chosen id,
so Redis refuses a second send of the same row (docs/internals/dedup.md), which is what
makes a relay that dies between Redis's reply and its DELETE harmless. A delay is kept as
the time the task is due, so that the time a row waits for the relay counts in it."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from obsq.task import Job, TaskMessage

DEFAULT_TABLE = "obsq_outbox"
EXPIRED_ON_ARRIVAL = 0.001  # seconds: the least expiry Redis keeps (it counts in ms)


def outbox_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """The outbox's table in `metadata`: give it an application's metadata and Alembic's
    autogenerate writes its migration; `Outbox(engine, table_name=name)` then uses it."""
    return Table(
        name, metadata,
        # the order rows are relayed in; SQLite gives an INTEGER primary key its rowid
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
               autoincrement=True),
        Column("task_id", String(255), nullable=False),
        Column("type", String(255), nullable=False),
        Column("payload", LargeBinary, nullable=False),  # JSON, or the producer's bytes
        Column("options", Text, nullable=False),  # JSON: queue and the options given
        Column("enqueued_at", Double, nullable=False),  # UNIX seconds, the producer's clock
    )


def row_of(m: TaskMessage, now: float) -> dict[str, Any]:
    """The row of a message checked at `now` (UNIX seconds)."""
    options: dict[str, Any] = {"queue": m.queue}
    if m.max_retry is not None:
        options["max_retry"] = m.max_retry
    if m.timeout is not None:
        options["timeout"] = m.timeout
    if m.retention:
        options["retention"] = m.retention
    if m.delay > 0:
        options["due"] = now + m.delay
    if m.unique_for:
        options["unique_for"] = m.unique_for
    if m.ordering_key:
        options["ordering_key"] = m.ordering_key
    if m.priority:
        options["priority"] = m.priority
    if m.headers:
        options["headers"] = m.headers
    if m.binary:
        options["binary"] = True
    if m.expires:
        options["expires_at"] = now + m.expires  # counted from the enqueue, not the relay
    if m.fairness_key:
        options["fairness_key"] = m.fairness_key
    return {"task_id": m.id, "type": m.type, "payload": m.payload,
            "options": orjson.dumps(options).decode(), "enqueued_at": now}


def job_of(task_id: str, task_type: str, payload: bytes, options_json: str) -> Job:
    """The Job that enqueues a row's task in Redis under the id it was given at enqueue. A
    row whose expiry passed while it waited is sent to expire at once: it ends dead with
    TaskExpired, never run."""
    options = orjson.loads(options_json)
    due = options.get("due")
    expires_at = options.get("expires_at")
    expires = None if expires_at is None else max(expires_at - time.time(),
                                                  EXPIRED_ON_ARRIVAL)
    return Job(task_type, bytes(payload) if options.get("binary") else orjson.loads(payload),
               queue=options["queue"], max_retry=options.get("max_retry"),
               timeout=options.get("timeout"), retention=options.get("retention"),
               eta=None if due is None else datetime.fromtimestamp(due, timezone.utc),
               unique_for=options.get("unique_for"), task_id=task_id,
               headers=options.get("headers") or {},
               ordering_key=options.get("ordering_key"), priority=options.get("priority"),
               expires=expires, fairness_key=options.get("fairness_key"))
