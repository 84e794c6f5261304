"""What the Inspector (obsq/inspection/inspector.py) asks of Redis: bounded pages of one state of a
queue or of one task group, the groups and batches of a queue, one task with everything
kept for it, workers with their last heartbeat, the repairs (requeue, delete, purge) one
bounded step per call, and the per-minute outcome counters the workers keep. A base of
Broker, so it shares its connection and its way of calling scripts; broker.py keeps the
hot path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from obsq.broker.calls import RedisCalls, ScriptCall
from obsq.broker.records import BatchRecord, GroupListing, GroupRecord
from obsq.broker.wire import REPLIES, argv, as_number, as_text

# How each state's page is ordered: what runs next first (pending: oldest first, from the
# right end of the list; scheduled/retry: soonest due; active: soonest lease expiry), what
# ended last first (dead, cancelled; completed by when it is removed, its end plus its
# retention, which is the order of their ends where tasks keep the same retention).
PAGE_ORDER = {"pending": "list", "active": "asc", "scheduled": "asc", "retry": "asc",
              "dead": "desc", "completed": "desc", "cancelled": "desc"}
REVIVABLE = ("dead", "cancelled", "retry", "scheduled")
PURGEABLE = ("pending", "scheduled", "retry", "dead", "completed", "cancelled")
NAMESPACE_SCAN_SECONDS = 2.0

# One row of a page: id, score (ms, None for pending), type, retried, enqueued (ms), due
# (ms), done (ms), error head, payload head, owner ("<fence>:<worker id>" while running),
# size of a bytes payload (None: the payload is JSON), priority.
PageRow = tuple[str, "int | None", str, int, "int | None", "int | None", "int | None", str,
                bytes, str, "int | None", int]


class Inspection(RedisCalls):
    async def task_page(self, queue: str, state: str, offset: int, limit: int,
                        task_type: str, scan_cap: int) -> tuple[int, int | None, list[PageRow]]:
        """(tasks in the state, offset of the next page or None, rows); with a type filter
        at most `scan_cap` ids are looked at."""
        return _page(await self._script(*self._page_call(queue, state, offset, limit,
                                                          task_type, scan_cap)))

    async def page_totals(self, queues: Sequence[str], state: str) -> list[int]:
        """How many tasks each queue has in a state, as its pages count them (the
        partitions of a queue, whose pages follow one another), in one round trip."""
        replies = await self._scripts([self._page_call(q, state, 0, 0, "", 0) for q in queues])
        return [_page(reply)[0] for reply in replies]

    def _page_call(self, queue: str, state: str, offset: int, limit: int, task_type: str,
                   scan_cap: int) -> ScriptCall:
        return ("page", (self.keys(queue).by_state(state),),
                argv("page", order=PAGE_ORDER[state], offset=offset, limit=limit,
                     pattern=task_type, cap=scan_cap))

    async def group_page(self, queue: str, task_type: str, group: str, offset: int,
                         limit: int) -> tuple[int, int | None, list[PageRow]]:
        """A page of one group's waiting tasks, oldest first (as task_page)."""
        k = self.keys(queue)
        return _page(await self._script(
            "page", (k.group_types, k.group(task_type, group)),
            argv("page", order="head", offset=offset, limit=limit, pattern="", cap=limit)))

    async def group_listing(self, queue: str, offset: int, limit: int, batch_offset: int,
                            batch_limit: int) -> GroupListing:
        """A page of the queue's groups (by type, oldest first) and one of its batches (by
        the end of their claim), read together (groups.lua)."""
        return _listing(await self._script(*self._groups_call(queue, offset, limit,
                                                              batch_offset, batch_limit)))

    async def group_totals(self, queues: Sequence[str]) -> list[GroupListing]:
        """How many groups and batches each queue has (listings without rows), in one round
        trip."""
        return [_listing(reply) for reply in await self._scripts([
            self._groups_call(q, 0, 0, 0, 0) for q in queues])]

    def _groups_call(self, queue: str, offset: int, limit: int, batch_offset: int,
                     batch_limit: int) -> ScriptCall:
        k = self.keys(queue)
        return ("groups", (k.group_types, k.batches),
                argv("groups", offset=offset, limit=limit, batch_offset=batch_offset,
                     batch_limit=batch_limit))

    async def worker_records(self) -> list[tuple[dict[str, Any], int]]:
        """(description, last heartbeat in ms) of each worker whose heartbeat is current."""
        g = self.global_keys
        beats = await self._registry("workers", g.workers, self.redis.zrange(
            g.workers, 0, -1, withscores=True), [])
        if not beats:
            return []
        values = await self._get_many("workers", [g.worker(i.decode()) for i, _ in beats])
        return [(orjson.loads(v), int(score)) for (_, score), v in zip(beats, values) if v]

    async def revive(self, queue: str, state: str, task_ids: Sequence[str] = (),
                     batch: int = 1000) -> tuple[int, int, list[str]]:
        """One step of a requeue: the given ids, or the first `batch` of the state, back to
        pending. Returns (moved, left in the state, given ids that were not in it)."""
        k = self.keys(queue)
        reply = await self._script("revive", (k.by_state(state), k.pending, k.wake),
                                   argv("revive", reset=1 if state in ("dead", "cancelled") else 0,
                                        batch=batch, ids=task_ids))
        shape = REPLIES["revive"]
        r = shape.head_of(reply)
        return r.moved, r.left, [as_text(m.missing) for m in shape.records(reply)]

    async def delete_task(self, queue: str, task_id: str) -> str:
        """The state the deleted task was in; 'running' (refused) or '' (no such task)."""
        k = self.keys(queue)
        return as_text(await self._script("delete", _delete_keys(k),
                                        argv("delete", mode="id", id=task_id)))

    async def purge_step(self, queue: str, state: str, batch: int) -> tuple[int, int]:
        """Delete up to `batch` tasks of a state: (deleted, left)."""
        k = self.keys(queue)
        r = REPLIES["delete"].head_of(await self._script(
            "delete", _delete_keys(k), argv("delete", mode=state, batch=batch)))
        return r.deleted, r.left

    async def tally(self, counts: Mapping[str, Mapping[str, int]], ttl: float) -> None:
        """Add {queue: {outcome: count}} to the current minute's buckets."""
        calls = []
        for queue, by_outcome in counts.items():
            calls.append(("tally", (self.keys(queue).stats,),
                          argv("tally", by_outcome.items(), ttl=int(ttl * 1000))))
        if calls:
            await self._scripts(calls)

    async def outcome_counts(self, queues: Sequence[str], minutes: int,
                             outcomes: Sequence[str]
                             ) -> dict[str, tuple[int, list[list[int]]]]:
        """{queue: (Redis clock in ms, per minute, the current one first: the count of each
        outcome)}."""
        calls = [("throughput", (self.keys(q).stats,),
                  argv("throughput", minutes=minutes, outcomes=outcomes)) for q in queues]
        replies = await self._scripts(calls) if calls else []
        n = len(outcomes)
        return {q: (r[0], [r[i:i + n] for i in range(1, len(r), n)])
                for q, r in zip(queues, replies)}

    async def namespaces(self, seconds: float = NAMESPACE_SCAN_SECONDS) -> list[str]:
        """Namespaces with a queue registry (`<ns>:queues`), from a SCAN given at most
        `seconds` (a Redis with millions of keys answers with what was seen by then)."""
        found: set[str] = set()

        async def scan() -> None:
            async for key in self.redis.scan_iter(match="*:queues", count=1000, _type="set"):
                found.add(as_text(key)[:-len(":queues")])

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._guard("namespaces", scan()), seconds)
        return sorted(found)


def _page(reply: list[Any]) -> tuple[int, int | None, list[PageRow]]:
    """page.lua's reply: (total, next offset or None, rows)."""
    shape = REPLIES["page"]
    head = shape.head_of(reply)
    rows: list[PageRow] = [
        (as_text(r.id), as_number(r.score), as_text(r.type), as_number(r.retried) or 0,
         as_number(r.enqueued), as_number(r.due), as_number(r.done), as_text(r.error), r.payload,
         as_text(r.owner), as_number(r.size), as_number(r.priority) or 0)
        for r in shape.records(reply)]
    return head.total, (head.next_offset if head.next_offset >= 0 else None), rows


def _listing(reply: list[Any]) -> GroupListing:
    """groups.lua's reply."""
    shape = REPLIES["groups"]
    r = shape.head_of(reply)
    return GroupListing(
        r.now, r.total, r.next_offset if r.next_offset >= 0 else None, r.batch_total,
        r.next_batch if r.next_batch >= 0 else None,
        [GroupRecord(as_text(g.type), as_text(g.group), as_number(g.size) or 0,
                     as_number(g.first), as_number(g.last))
         for g in shape.rows_of("groups", r.groups)],
        [_batch_record(b) for b in shape.rows_of("batches", r.batches)])


def _batch_record(b: Any) -> BatchRecord:
    """A batch of groups.lua's reply; fields written by hand read as empty or 0."""
    if b.type is None:  # its hash is not a hash
        return BatchRecord(as_text(b.id), as_number(b.claim_end), "", "", [], "", 0, "", False)
    return BatchRecord(as_text(b.id), as_number(b.claim_end), as_text(b.type), as_text(b.group),
                       as_text(b.ids).split(), as_text(b.owner), as_number(b.failures) or 0,
                       as_text(b.error))


def _delete_keys(k: Any) -> tuple[str, ...]:
    return (k.pending, k.scheduled, k.retry, k.dead, k.completed, k.cancelled, k.active)
