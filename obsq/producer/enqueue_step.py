"""One enqueue, whichever transport writes it: the Client's event loop (each queue's group
through the EnqueueCoalescer) or the SyncClient's caller thread (through the
BlockingProducer). Both ask this step the same things in the same order: the jobs checked
and encoded (`prepare`), the partition counts to read (`to_read`), each message placed and
the messages grouped by queue (`plan`: one script call writes one queue's) and the
TaskInfos in the caller's order from the statuses Redis replied (`EnqueuePlan.answer`).
Only the Redis calls between are the transport's, so the two cannot drift apart. Flows
and grouped enqueues use the same preparation and placement."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from obsq.app import App, Hooks
from obsq.broker import Enqueued
from obsq.errors import DuplicateTask
from obsq.producer.placement import Placement
from obsq.task import Job, TaskInfo, TaskMessage, build_message

log = logging.getLogger("obsq")


class EnqueueStep:
    """A producer's enqueue without its Redis calls: `app` gives each route's defaults,
    `refusal_hooks` (the producer's, after the App's) hear of each job refused."""

    def __init__(self, app: App | None, placement: Placement,
                 refusal_hooks: Hooks[[Job, Exception]]) -> None:
        self.app = app
        self.placement = placement
        self.refusal_hooks = refusal_hooks
        self._unhandled: set[str] = set()  # types the App has no handler for, warned of

    def prepare(self, jobs: Sequence[Job], now: float, warn: bool = True,
                group: bool = False) -> list[TaskMessage]:
        """The jobs checked and encoded at `now` (ValueError or TypeError for the first
        refused, told to the refusal hooks), then (`warn`) a type the App cannot run said;
        `group`: grouped tasks, whose aggregator runs, not a handler."""
        messages = [self._message(job, now) for job in jobs]
        if warn:
            self._warn_if_unhandled(jobs, group)
        return messages

    def to_read(self, messages: Iterable[TaskMessage]) -> list[str]:
        """The queues whose partition counts the transport reads from Redis before `plan`."""
        return self.placement.unknown([m.queue for m in messages if not m.partition])

    def plan(self, messages: list[TaskMessage], counts: dict[str, int],
             group: str = "") -> EnqueuePlan:
        """Each message placed in its partition (`counts`: those `to_read` named, as read),
        and the messages grouped by queue. `group`: grouped tasks' group, kept in one
        partition."""
        if counts:
            self.placement.learn(counts)
        self.placement.assign(messages, group)
        return EnqueuePlan(messages, group_by_queue(messages))

    def _message(self, job: Job, now: float) -> TaskMessage:
        try:
            return self._checked_message(job, now)
        except (ValueError, TypeError) as exc:
            if self.app is not None:
                self.app.refusal_hooks(job, exc)
            self.refusal_hooks(job, exc)
            raise

    def _checked_message(self, job: Job, now: float) -> TaskMessage:
        if self.app is None:
            return build_message(job, now=now)
        route = self.app.route(job.type)
        if route is None:
            return build_message(job, now=now, max_payload=self.app.max_payload)
        return build_message(job, queue=route.queue, max_retry=route.max_retry,
                             timeout=route.timeout, now=now, priority=route.priority,
                             max_payload=self.app.max_payload_of(route))

    def _warn_if_unhandled(self, jobs: Sequence[Job], group: bool) -> None:
        """A typo in a type shows otherwise only as tasks handed on for a day, or grouped tasks
        waiting for good: said once per type, where the producer's App registers handlers."""
        app = self.app
        if app is None or not app.routes:
            return
        for job in jobs:
            if job.type in self._unhandled:
                continue
            if group:  # the aggregated task is what runs: the grouped type needs no handler
                missing = ("aggregator (app.aggregate)" if app.aggregation(job.type) is None
                           else "")
            else:
                missing = "handler" if app.route(job.type) is None else ""
            if missing:
                self._unhandled.add(job.type)
                log.warning("task type %r has no %s in the App of this Client: its tasks "
                            "wait or fail until a worker's App has one", job.type, missing)


class EnqueuePlan:
    """An enqueue's messages, placed, and grouped by the queue (or partition) each goes to."""

    __slots__ = ("groups", "messages")

    def __init__(self, messages: list[TaskMessage],
                 groups: dict[str, list[TaskMessage]]) -> None:
        self.messages = messages
        self.groups = groups

    def answer(self, replies: Sequence[list[Enqueued]]) -> list[TaskInfo]:
        """The TaskInfos in the order of the messages, from each group's statuses (in the
        order of `groups`)."""
        if len(replies) == 1:
            return [info_after_enqueue(m, s) for m, s in zip(self.messages, replies[0])]
        statuses: dict[int, Enqueued] = {}  # by message object: two jobs may share a task_id
        for group, reply in zip(self.groups.values(), replies):
            statuses.update((id(m), status) for m, status in zip(group, reply))
        return [info_after_enqueue(m, statuses[id(m)]) for m in self.messages]


def group_by_queue(messages: list[TaskMessage]) -> dict[str, list[TaskMessage]]:
    """The messages of each queue (or partition), in their order: one script call writes
    one queue's."""
    by_queue: dict[str, list[TaskMessage]] = {}
    for m in messages:
        by_queue.setdefault(m.partition or m.queue, []).append(m)
    return by_queue


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


def info_after_grouping(m: TaskMessage, status: Enqueued) -> TaskInfo:
    """A grouped task waits in its group (state `aggregating`) for its aggregator."""
    return TaskInfo(id=m.id, type=m.type, queue=m.queue, state="aggregating",
                    headers=m.headers, duplicate=not status.created, partition=m.partition)
