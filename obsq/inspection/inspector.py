"""The operator's view of a namespace: what the queues hold, what each task was given and
why it failed, which workers run, and the repairs. The CLI (`obsq stats|queues|tasks|...`)
and the web console (`obsq ui`) are both built on it.

Every read is bounded, whatever the size of a queue: a page of tasks is a window by rank,
a type filter looks at a bounded number of tasks, and repairs of a whole state (requeue,
purge) run in steps of STEP tasks, each one short script.

A partitioned queue (`app.queue(name, partitions=N)`) is one queue here: its name reads and
repairs all its partitions (obsq/inspection/partition_view.py says how they are summed and paged),
and a partition's own name (`<queue>#<i>/<n>.<salt>`, in QueueInfo.partitions) that
partition alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from obsq.app import App
from obsq.broker import TASK_STATES, Broker, GroupListing
from obsq.broker.inspection import PURGEABLE, REVIVABLE
from obsq.errors import ConfigurationError, QueueNotFound, TaskNotFound
from obsq.flow import FlowInfo
from obsq.inspection.group_view import BatchInfo, GroupInfo, GroupPage, group_page
from obsq.inspection.inspected import (
    PartitionInfo,
    QueueInfo,
    Rate,
    Requeued,
    TaskDetail,
    TaskPage,
    TaskSummary,
    WorkerInfo,
    as_data,
    detail,
    rates,
    summaries,
)
from obsq.inspection.partition_view import across, combined, partitions_of, readable, resolve
from obsq.names import validate_name, validate_namespace
from obsq.producer.client import Client
from obsq.schedule import ScheduleInfo, read_schedules
from obsq.settings import DEFAULT_REDIS_URL
from obsq.task import timestamp_to_datetime

STEP = 1000  # tasks per script call of a requeue or purge: bounds how long one holds Redis
MAX_PAGE = 500
TYPE_SCAN_CAP = 10_000  # tasks a type filter looks at for one page
COUNTED_OUTCOMES = ("success", "retry", "dead")  # handler runs; retry and dead are failures


class Inspector:
    """Read and repair the queues of one namespace. All methods are coroutines."""

    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, namespace: str = "obsq", *,
                 broker: Broker | None = None) -> None:
        self.namespace = validate_namespace(namespace)
        self.broker = broker or Broker(redis_url, namespace)
        # The Inspector only warns of a Redis that may evict (check()); its Client follows.
        self._client = Client(redis_url, namespace, broker=self.broker, allow_eviction=True)

    async def check(self) -> str:
        """Fail with one ConfigurationError for a wrong URL, password or Redis version;
        warn of a maxmemory-policy that may evict task data."""
        version = await self.broker.check()
        await self.broker.check_memory_policy(refuse=False)
        return version

    # -- reading --------------------------------------------------------------------------

    async def queue_names(self) -> list[str]:
        """The namespace's queues, a partitioned one by its own name."""
        return list(partitions_of(await self.broker.queues()))

    async def queues(self, names: Sequence[str] | None = None) -> list[QueueInfo]:
        """Depth per state, latency, pause flag, throughput and failures of each queue (of
        every queue of the namespace when `names` is None); a partitioned queue's summed,
        with each partition's in QueueInfo.partitions."""
        registered = await self.broker.queues()
        return await self._figures(partitions_of(registered) if names is None else {
            name: resolve(name, registered) or [name] for name in names})

    async def queue(self, name: str) -> QueueInfo:
        return (await self._figures({name: await self._partitions(name)}))[0]

    async def _figures(self, wanted: dict[str, list[str]]) -> list[QueueInfo]:
        """The QueueInfo of each queue of `wanted`, stored as the queues it maps to."""
        physical = list(dict.fromkeys(q for parts in wanted.values() for q in parts))
        if not physical:
            return []
        stats = await self.broker.queue_stats(physical)
        counts = await self.broker.outcome_counts(physical, 61, COUNTED_OUTCOMES)
        infos = {q: QueueInfo(q, stats[q].depth, stats[q].latency, stats[q].paused,
                              *rates(*counts[q]), keys_waiting=stats[q].keys_waiting,
                              top_keys=list(stats[q].top_keys)) for q in physical}
        declared = await self.broker.partition_counts(list(wanted))
        return [combined(name, [infos[q] for q in parts], declared[name])
                for name, parts in wanted.items()]

    async def tasks(self, queue: str, state: str, limit: int = 20, offset: int = 0,
                    type: str | None = None) -> TaskPage:
        """One page of a state, in the order things happen: pending oldest first, scheduled
        and retry soonest due first, active by lease, dead and completed newest first.
        With `type` (exact, or a prefix ending in ':' or '.'), a page looks at no more
        than TYPE_SCAN_CAP tasks; `next_offset` goes on from there."""
        if state not in TASK_STATES:
            raise ValueError(f"state must be one of {', '.join(TASK_STATES)}, got {state!r}")
        _check_page(limit, offset)
        parts = await self._partitions(queue)

        async def read(i: int, start: int, n: int, cap: int) -> tuple[list[TaskSummary],
                                                                       int | None]:
            _, next_start, rows = await self.broker.task_page(parts[i], state, start, n,
                                                              type or "", cap)
            return summaries(parts[i], state, rows), next_start

        if len(parts) == 1:
            total, next_offset, rows = await self.broker.task_page(
                parts[0], state, offset, limit, type or "", TYPE_SCAN_CAP)
            found = summaries(parts[0], state, rows)
        else:
            sizes = await self.broker.page_totals(parts, state)
            total = sum(sizes)
            found, next_offset = await across(sizes, offset, limit, read, TYPE_SCAN_CAP)
        return TaskPage(queue, state, found, total, offset, limit, next_offset, type or None)

    async def groups(self, queue: str, limit: int = 20, offset: int = 0,
                     batch_offset: int = 0, *, app: App | None = None) -> GroupPage:
        """A page of the queue's task groups (by type, each type's oldest first) and a page
        of its batches (claimed, or waiting again after their aggregator failed), `limit`
        of each. Given the App, each group says when its aggregator's rules make it due."""
        _check_page(limit, offset, batch_offset)
        parts = await self._partitions(queue)
        if len(parts) == 1:
            listing = await self.broker.group_listing(parts[0], offset, limit, batch_offset,
                                                      limit)
            return group_page(queue, listing, offset, limit, batch_offset, app)
        counts = await self.broker.group_totals(parts)

        async def groups(i: int, start: int, n: int, _: int) -> tuple[list[Any], int | None]:
            found = await self.broker.group_listing(parts[i], start, n, 0, 0)
            return found.groups, found.next_offset

        async def batches(i: int, start: int, n: int, _: int) -> tuple[list[Any], int | None]:
            found = await self.broker.group_listing(parts[i], 0, 0, start, n)
            return found.batches, found.next_batch_offset

        group_rows, next_offset = await across([c.total for c in counts], offset, limit,
                                               groups, limit)
        batch_rows, next_batch = await across([c.batch_total for c in counts], batch_offset,
                                              limit, batches, limit)
        listing = GroupListing(counts[0].now_ms, sum(c.total for c in counts), next_offset,
                               sum(c.batch_total for c in counts), next_batch, group_rows,
                               batch_rows)
        return group_page(queue, listing, offset, limit, batch_offset, app)

    async def group_tasks(self, queue: str, type: str, group: str, limit: int = 20,
                          offset: int = 0) -> TaskPage:
        """A page of the tasks waiting in one group, oldest first (state "aggregating");
        a group lives in one partition of its queue."""
        _check_page(limit, offset)
        for kept_in in await self._partitions(queue):
            total, next_offset, rows = await self.broker.group_page(kept_in, type, group,
                                                                    offset, limit)
            if total:
                break
        return TaskPage(queue, "aggregating", summaries(kept_in, "aggregating", rows), total,
                        offset, limit, next_offset, type)

    async def task(self, task_id: str, queue: str | None = None) -> TaskDetail:
        """Everything about one task (in whichever partition of `queue` holds it); raises
        TaskNotFound."""
        given = queue
        queue = await self._holder(task_id, queue)
        if queue is not None:
            fields, progress, owner, lease = await self.broker.task_record(queue, task_id)
            if fields:
                return detail(task_id, queue, fields, progress, owner, lease)
        if given is not None:
            elsewhere = await self.broker.find_queue(task_id)
            if elsewhere is not None:
                where = readable(elsewhere) if elsewhere != readable(elsewhere) else repr(
                    elsewhere)  # a partition by its queue, as the doctor names it
                raise TaskNotFound(f"no task {task_id!r} in queue {given!r}: it is in queue "
                                   f"{where}")
        raise TaskNotFound(f"no task {task_id!r} in namespace {self.namespace!r} (tasks "
                           "without retention are removed when they complete)")

    async def workers(self) -> list[WorkerInfo]:
        """The live workers, as their heartbeats describe them."""
        workers = []
        for d, beat in await self.broker.worker_records():
            started = d.get("started") or 0
            workers.append(WorkerInfo(
                id=d.get("id", "?"), host=d.get("host", "?"), pid=int(d.get("pid", 0)),
                queues=dict(d.get("queues") or {}), concurrency=int(d.get("concurrency", 0)),
                busy=int(d.get("busy", 0)), processed=int(d.get("processed") or 0),
                started_at=datetime.fromtimestamp(started, tz=timezone.utc) if started
                else None, last_heartbeat=timestamp_to_datetime(beat),
                version=str(d.get("version", "")), draining=bool(d.get("draining")),
                subscriptions=[str(x) for x in d.get("subscriptions") or ()]))
        return sorted(workers, key=lambda w: w.id)

    async def schedules(self) -> list[ScheduleInfo]:
        """The schedule entries (the App's, once a scheduler has written them, and those
        added at run time) with their next and last fire, soonest first."""
        return await read_schedules(self.broker)

    async def flows(self, limit: int = 20, offset: int = 0) -> tuple[int, list[FlowInfo]]:
        """How many flows are kept (running, or ended within their retention), and a page."""
        return await self._client.flows.page(limit, offset)

    async def flow(self, flow_id: str) -> FlowInfo:
        return await self._client.flows.info(flow_id)

    async def is_flow(self, task_id: str, queue: str | None = None) -> bool:
        """Whether the id, which no task has (none in `queue` when named), is a flow's: the
        task commands point a flow's id to the flow's."""
        return (queue is None and await self.broker.find_queue(task_id) is None
                and await self._client.flows.named(task_id, None))

    async def namespaces(self) -> list[str]:
        """The namespaces that hold queues on this Redis (a SCAN bounded in time)."""
        return await self.broker.namespaces()

    # -- repairing ------------------------------------------------------------------------

    async def requeue(self, queue: str, state: str = "dead",
                      ids: Sequence[str] | None = None) -> Requeued:
        """Move tasks of the dead, retry or scheduled state to pending now: the given ids,
        or every task that was in the state when the call began (in steps of STEP)."""
        if state not in REVIVABLE:
            raise ValueError(f"only {', '.join(REVIVABLE)} tasks can be requeued, not {state}")
        moved = left = 0
        if ids:
            missing = list(ids)  # each partition is asked for the ids the others had not
            for part in await self._partitions(queue):
                still, part_left = [], 0
                for start in range(0, len(missing), STEP):
                    m, part_left, gone = await self.broker.revive(
                        part, state, missing[start:start + STEP])
                    moved += m
                    still += gone
                missing, left = still, left + part_left
            return Requeued(queue, state, moved, left, missing)
        for part in await self._partitions(queue):
            m, part_left = await self._in_steps(part, state, self.broker.revive)
            moved, left = moved + m, left + part_left
        return Requeued(queue, state, moved, left)

    async def delete(self, task_id: str | FlowInfo, queue: str | None = None) -> str:
        """Delete a task in any state but running, with its data; returns the state it was
        in. Raises TaskNotFound or TaskRunning (Client.delete)."""
        return await self._client.delete(task_id, await self._where(task_id, queue))

    async def cancel(self, task_id: str | FlowInfo, queue: str | None = None) -> str:
        """Cancel a task (Client.cancel): "cancelled", "running" (its worker stops it), or
        the state it had ended in. Raises TaskNotFound."""
        return await self._client.cancel(task_id, await self._where(task_id, queue))

    async def purge(self, queue: str, state: str) -> int:
        """Delete every task that was in a state (not active) when the call began, in steps
        of STEP; returns how many were deleted."""
        if state not in PURGEABLE:
            raise ValueError(f"only {', '.join(PURGEABLE)} tasks can be purged, not {state}")
        deleted = 0
        for part in await self._partitions(queue):
            deleted += (await self._in_steps(part, state, self.broker.purge_step))[0]
        return deleted

    async def pause(self, queue: str) -> list[str]:
        """Workers stop taking tasks from the queue (running ones finish): from each of its
        partitions registered now (those a new count adds later are not paused); returns
        the queues or partitions paused."""
        return await self._set_paused(queue, True)

    async def unpause(self, queue: str) -> list[str]:
        return await self._set_paused(queue, False)

    async def close(self) -> None:
        await self.broker.close()

    async def __aenter__(self) -> Inspector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- helpers --------------------------------------------------------------------------

    async def _set_paused(self, queue: str, paused: bool) -> list[str]:
        parts = await self._partitions(queue)
        for part in parts:
            await self.broker.set_paused(part, paused)
        return parts

    async def _partitions(self, queue: str) -> list[str]:
        """The registered queues `queue` names: its partitions, or itself; QueueNotFound."""
        try:
            validate_name("queue", queue)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        parts = resolve(queue, await self.broker.queues())
        if not parts:
            raise QueueNotFound(f"no queue {queue!r} in namespace {self.namespace!r}")
        return parts

    async def _holder(self, task_id: str, queue: str | None) -> str | None:
        """The queue or partition holding the task: of `queue` (any when None)."""
        if queue is None:
            return await self.broker.find_queue(task_id)
        parts = resolve(queue, await self.broker.queues())
        if len(parts) == 1:
            return parts[0]
        return await self.broker.find_queue(task_id, parts) if parts else queue

    async def _where(self, task_id: str | FlowInfo, queue: str | None) -> str | None:
        """Where Client.delete or cancel looks: the partition holding the task when found."""
        if queue is None or isinstance(task_id, FlowInfo):
            return queue
        return await self._holder(task_id, queue) or queue

    async def _in_steps(self, queue: str, state: str, step: Any) -> tuple[int, int]:
        """Run `step(queue, state, batch=n) -> (done, left, ...)` until the tasks that were
        in the state at the start are done (tasks arriving meanwhile are left alone)."""
        todo = (await self.broker.queue_stats([queue]))[queue].depth[state]
        done, left = 0, todo
        while done < todo and left:
            n, now_left, *_ = await step(queue, state, batch=min(STEP, todo - done))
            if not n and now_left >= left:
                break  # nothing moved: the rest went elsewhere meanwhile
            done, left = done + n, now_left
        return done, left


def _check_page(limit: int, *offsets: int) -> None:
    if not 1 <= limit <= MAX_PAGE or min(offsets) < 0:
        raise ValueError(f"limit must be 1 to {MAX_PAGE} and offset not negative")


__all__ = ["BatchInfo", "GroupInfo", "GroupPage", "Inspector", "PartitionInfo", "QueueInfo",
           "Rate", "Requeued",
           "ScheduleInfo", "TaskDetail", "TaskPage", "TaskSummary", "WorkerInfo", "as_data"]
