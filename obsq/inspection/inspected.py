"""What the Inspector returns: a queue's figures, pages of task summaries, a task in full,
live workers, a requeue's outcome; built from the broker's rows, and turned into plain
data for JSON (`as_data`)."""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from obsq.broker.inspection import PageRow
from obsq.names import queue_of
from obsq.task import TaskInfo, bytes_preview, decode_stored_json, timestamp_to_datetime


@dataclass
class Rate:
    """Handler runs that finished in a window, and how many of them failed."""

    processed: int = 0
    failed: int = 0


@dataclass
class PartitionInfo:
    """One partition of a partitioned queue (obsq/names.py), as it stands alone."""

    name: str  # its own name, which addresses it alone (<queue>#<index>/<count>.<salt>)
    index: int
    count: int  # partitions of its queue when it was made
    depth: dict[str, int]
    latency: float
    paused: bool
    last_minute: Rate
    last_hour: Rate
    earlier: bool = False  # of a count its queue no longer has: listed while it holds tasks

    @property
    def size(self) -> int:
        return sum(self.depth.values())


@dataclass
class QueueInfo:
    name: str
    depth: dict[str, int]  # of a partitioned queue: summed over its partitions
    latency: float  # seconds the oldest pending task has waited (the longest of partitions)
    paused: bool  # of a partitioned queue: all its partitions are (each says whether it is)
    last_minute: Rate
    last_hour: Rate
    per_minute: list[Rate] = field(default_factory=list)  # the last hour, oldest first
    partitions: list[PartitionInfo] = field(default_factory=list)  # none: one Redis queue
    partition_count: int = 0  # the count its workers declared (partition_view.py); 0: none
    keys_waiting: int = 0  # fairness keys with waiting tasks (partitions: summed)
    # the fairness keys with most waiting tasks (at most TOP_FAIRNESS_KEYS): (key, tasks)
    top_keys: list[tuple[str, int]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(self.depth.values())


@dataclass
class TaskSummary:
    """A row of a page: enough to pick a task out of a list."""

    id: str
    queue: str
    state: str
    type: str
    retry_count: int
    enqueued_at: datetime | None
    due_at: datetime | None
    finished_at: datetime | None
    error: str  # its first few hundred characters
    payload: str  # the first few hundred bytes of its JSON, or a preview of its bytes
    worker: str | None  # the worker running it, while active
    priority: int = 0  # 0 to 9, higher first within its queue
    partition: str = ""  # the partition of its queue holding it, or "" (not partitioned)


@dataclass
class TaskPage:
    queue: str
    state: str
    tasks: list[TaskSummary]
    total: int  # tasks in the state, whatever the type filter
    offset: int
    limit: int
    next_offset: int | None  # None on the last page
    type: str | None = None


@dataclass
class TaskDetail(TaskInfo):
    """Everything kept for a task: its TaskInfo and what only an operator needs."""

    options: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    due_at: datetime | None = None
    recoveries: int = 0  # times it was taken back from a lost worker
    unique_key: str | None = None
    # its debounce key: while it waits, enqueues with the key replace it (Job.debounce_key)
    debounce_key: str | None = None
    worker: str | None = None  # the worker running it now
    fence: int | None = None  # the fencing token of the running attempt
    lease_expires_at: datetime | None = None


@dataclass
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: dict[str, int]
    concurrency: int
    busy: int
    processed: int
    started_at: datetime | None
    last_heartbeat: datetime | None
    version: str
    draining: bool
    subscriptions: list[str] = field(default_factory=list)  # "<event>@<subscriber>" it serves


@dataclass
class Requeued:
    queue: str
    state: str
    moved: int
    left: int  # still in the state afterwards (arrived while it ran, or not asked for)
    missing: list[str] = field(default_factory=list)  # ids asked for that were not there


def summaries(kept_in: str, state: str, rows: list[PageRow]) -> list[TaskSummary]:
    """The rows of a page of `kept_in`, a queue or one of its partitions."""
    queue = queue_of(kept_in)
    partition = kept_in if kept_in != queue else ""
    return [TaskSummary(
        id=task_id, queue=queue, partition=partition, state=state, type=task_type,
        retry_count=retried,
        enqueued_at=timestamp_to_datetime(enq),
        due_at=timestamp_to_datetime(score if state in ("scheduled", "retry") else due),
        finished_at=timestamp_to_datetime(done), error=error,
        payload=payload.decode(errors="replace") if binary_size is None else
        bytes_preview(payload, binary_size),
        worker=owner.partition(":")[2] or None, priority=priority)
        for (task_id, score, task_type, retried, enq, due, done, error, payload, owner,
             binary_size, priority) in rows]


def rates(now_ms: int, minutes: list[list[int]]) -> tuple[Rate, Rate, list[Rate]]:
    """Sliding windows over per-minute buckets (the current minute first): the current
    minute plus the part of the oldest one the window still covers."""
    rates = [Rate(sum(m), m[1] + m[2]) for m in minutes]
    covered = 1 - (now_ms % 60_000) / 60_000

    def window(n: int) -> Rate:
        whole, edge = rates[:n], rates[n] if n < len(rates) else Rate()
        return Rate(round(sum(r.processed for r in whole) + edge.processed * covered),
                    round(sum(r.failed for r in whole) + edge.failed * covered))

    return window(1), window(60), list(reversed(rates[:60]))


def detail(task_id: str, queue: str, f: dict[bytes, bytes], progress: bytes | None,
            owner: str, lease_ms: int | None) -> TaskDetail:
    info = TaskInfo.from_fields(task_id, queue, f, progress)
    fence, _, worker = owner.partition(":")
    options = decode_stored_json(f.get(b"opts"))
    traceback = f.get(b"tb")
    detail = TaskDetail(
        **{name.name: getattr(info, name.name) for name in dataclasses.fields(TaskInfo)},
        options=options if isinstance(options, dict) else {},
        traceback=traceback.decode(errors="replace") if traceback else None,
        due_at=timestamp_to_datetime(f.get(b"due")), recoveries=int(f.get(b"recov") or 0),
        unique_key=f[b"uniq"].decode() if f.get(b"uniq") else None,
        debounce_key=f[b"dbk"].decode(errors="replace") if f.get(b"dbk") else None)
    if worker:  # an attempt runs
        detail.worker, detail.fence = worker, int(fence)
        detail.lease_expires_at = timestamp_to_datetime(lease_ms)
    return detail


def as_data(value: Any) -> Any:
    """Inspector results as plain JSON-ready data (datetimes in ISO 8601, UTC; a bytes
    payload as {"base64": ...})."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: as_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(v) for v in value]
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    return value
