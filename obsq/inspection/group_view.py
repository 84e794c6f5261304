"""What an operator sees of task groups (Inspector.groups): each group waiting for its
aggregator, with its size and how long its tasks have waited, and each batch claimed by a
worker or waiting after its aggregator failed. Both come from one bounded read
(groups.lua), a page of each.

When a group becomes due is up to its aggregator's rules (`app.aggregate`), which only the
code knows: given the App, each group says when; without it, Redis alone cannot tell."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from obsq.app import App
from obsq.broker import BatchRecord, GroupListing, GroupRecord
from obsq.task import timestamp_to_datetime


@dataclass
class GroupInfo:
    type: str
    group: str
    size: int  # tasks waiting in it
    oldest_at: datetime | None  # when its oldest waiting task was enqueued
    newest_at: datetime | None
    age: float  # seconds its oldest task has waited (Redis's clock)
    idle: float  # seconds since its newest task arrived
    due_at: datetime | None = None  # when its aggregator's rules make it due (only known
    #                                 given the App; in the past: no worker took it yet)


@dataclass
class BatchInfo:
    """Grouped tasks claimed for one run of their aggregator, not ended yet."""

    id: str  # also the id of the task its aggregator makes
    type: str
    group: str
    size: int  # tasks in it
    claim_expires_at: datetime | None  # then any worker may claim it (after a failure: the
    #                                    end of its backoff)
    failures: int  # runs of its aggregator that failed so far
    error: str | None  # the last failure, or why its record in Redis cannot be read
    worker: str | None  # the worker holding its claim; None while it waits to be claimed


@dataclass
class GroupPage:
    queue: str
    groups: list[GroupInfo]
    total: int  # groups in the queue
    offset: int
    limit: int
    next_offset: int | None  # None on the last page
    batches: list[BatchInfo]
    batch_total: int
    batch_offset: int
    next_batch_offset: int | None


def group_page(queue: str, listing: GroupListing, offset: int, limit: int,
               batch_offset: int, app: App | None) -> GroupPage:
    now = listing.now_ms
    return GroupPage(queue, [_group(g, now, app) for g in listing.groups], listing.total,
                     offset, limit, listing.next_offset,
                     [_batch(b) for b in listing.batches], listing.batch_total, batch_offset,
                     listing.next_batch_offset)


def _group(record: GroupRecord, now_ms: int, app: App | None) -> GroupInfo:
    first, last = record.first_ms or now_ms, record.last_ms or now_ms
    return GroupInfo(record.type, record.group, record.size,
                     timestamp_to_datetime(record.first_ms),
                     timestamp_to_datetime(record.last_ms),
                     age=max(now_ms - first, 0) / 1000, idle=max(now_ms - last, 0) / 1000,
                     due_at=timestamp_to_datetime(_due_ms(record, first, last, now_ms, app)))


def _due_ms(record: GroupRecord, first: int, last: int, now_ms: int,
            app: App | None) -> int | None:
    """The rules of claim_batches.lua: full now, else max_delay after the oldest task or
    grace_period after the newest, whichever comes first."""
    rules = app.aggregation(record.type) if app is not None else None
    if rules is None:
        return None
    if record.size >= rules.max_size:
        return now_ms
    return int(min(first + rules.max_delay * 1000, last + rules.grace_period * 1000))


def _batch(record: BatchRecord) -> BatchInfo:
    error = record.error or None
    if not record.readable:
        error = "its record in Redis is not a hash (written by hand): workers cannot read it"
    elif not record.type:
        error = "its record in Redis is gone: the next claim drops it"
    return BatchInfo(record.id, record.type, record.group, len(record.task_ids),
                     timestamp_to_datetime(record.claim_end_ms), record.failures, error,
                     record.owner or None)
