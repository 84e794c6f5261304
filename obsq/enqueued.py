"""What an enqueue answers: each job's TaskInfo, from the statuses Redis replied for the
messages of each queue, in the order the caller gave them (the Client's and the
SyncClient's enqueues alike)."""

from __future__ import annotations

from collections.abc import Sequence

from obsq.broker import Enqueued
from obsq.errors import DuplicateTask
from obsq.task import TaskInfo, TaskMessage


def group_by_queue(messages: list[TaskMessage]) -> dict[str, list[TaskMessage]]:
    """The messages of each queue (or partition), in their order: one script call writes
    one queue's."""
    by_queue: dict[str, list[TaskMessage]] = {}
    for m in messages:
        by_queue.setdefault(m.partition or m.queue, []).append(m)
    return by_queue


def infos_in_order(messages: list[TaskMessage], by_queue: dict[str, list[TaskMessage]],
                   replies: Sequence[list[Enqueued]]) -> list[TaskInfo]:
    """The TaskInfos in the order of `messages`, from each queue's statuses."""
    statuses: dict[int, Enqueued] = {}  # by message object: two jobs may share a task_id
    for group, reply in zip(by_queue.values(), replies):
        statuses.update((id(m), status) for m, status in zip(group, reply))
    return [info_after_enqueue(m, statuses[id(m)]) for m in messages]


def unless_duplicate(info: TaskInfo) -> TaskInfo:
    """`enqueue` of one task raises what `enqueue_many` reports as `duplicate`."""
    if info.duplicate:
        raise DuplicateTask(f"task {info.type!r} is a duplicate of {info.id}", info.id)
    return info


def info_after_enqueue(m: TaskMessage, status: Enqueued) -> TaskInfo:
    return TaskInfo(id=status.existing_id or m.id, type=m.type, queue=m.queue,
                    state="scheduled" if m.delay > 0 else "pending", max_retry=m.max_retry,
                    headers=m.headers, duplicate=not status.created, priority=m.priority,
                    partition=m.partition)
