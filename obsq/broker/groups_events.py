"""Redis calls of the features that fan work in and out: task groups (grouped tasks wait
in their group until a batch of them is claimed for the App's aggregator) and event
subscriptions (the subscribers that get a copy of each published event)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import orjson

from obsq.broker.calls import RedisCalls, ScriptCall
from obsq.broker.records import Batch, Claimed, Enqueued, GroupedTask
from obsq.broker.wire import REPLIES, argv
from obsq.task import TaskMessage

# (pattern, max_size, max_delay, grace_period): how a worker aggregates the types a route
# pattern covers
Aggregation = tuple[str, int, float, float]


class GroupsAndEvents(RedisCalls):
    # -- task groups ----------------------------------------------------------------------

    async def group(self, queue: str, task_type: str, group: str,
                    messages: Sequence[TaskMessage]) -> list[Enqueued]:
        """Add tasks of one type to a group of `queue` (group.lua)."""
        k = self.keys(queue)
        args = argv("group", [(m.id, m.payload, "bin" if m.binary else "payload",
                               m.encoded_headers(), "1" if m.id_chosen else "")
                              for m in messages], type=task_type, group=group)
        statuses = await self._script("group", (k.group_types, k.grouped), args)
        return [Enqueued(not s) for s in statuses]

    async def claim_batches(self, queue: str, owner: str, lease: float,
                            aggregations: Sequence[Aggregation], limit: int) -> Claimed:
        """Batches for the caller's aggregations (the most specific pattern first): those
        whose claim ran out, then the due groups' oldest tasks (claim_batches.lua)."""
        k = self.keys(queue)
        argument = orjson.dumps({
            "ids": [os.urandom(16).hex() for _ in range(limit)],
            "patterns": [(p, size, int(delay * 1000), int(grace * 1000))
                         for p, size, delay, grace in aggregations]})
        shape = REPLIES["claim_batches"]
        r = shape.head_of(await self._script(
            "claim_batches", (k.batches, k.grouped, k.group_types),
            argv("claim_batches", owner=owner, lease=max(int(lease * 1000), 1), plan=argument)))
        return Claimed(
            [Batch(b.id.decode(), queue, b.type.decode(), b.group.decode(), int(b.fence),
                   int(b.failures),
                   [GroupedTask(t.id.decode(), t.payload, t.headers, bool(t.binary))
                    for t in shape.rows_of("tasks", b.tasks)])
             for b in shape.rows_of("batches", r.batches)],
            int(r.wait) / 1000 if int(r.wait) >= 0 else None)

    async def end_batch(self, batch: Batch, error: str | None = None,
                        retry_in: float = 0.0) -> bool:
        """Finish a batch whose aggregated task is enqueued (`error` None; False when it
        was finished already), or hand it back after a failure, to be claimed again in
        `retry_in` seconds (False when another claim holds it now)."""
        k = self.keys(batch.queue)
        return bool(await self._script(
            "end_batch", (k.batches,),
            argv("end_batch", batch=batch.id, fence=batch.fence,
                 outcome="done" if error is None else "failed", error=error or "",
                 delay=int(retry_in * 1000), window=int(self.dedup_window * 1000))))

    async def release_batches(self, owner: str, batches: Sequence[Batch]) -> int:
        """Hand back batches `owner` claims and will not end (it is stopping), so that
        another worker takes them at once; only the claims it still holds, by their fence
        (release_batches.lua). Returns how many were released."""
        by_queue: dict[str, list[tuple[str, int]]] = {}
        for batch in batches:
            by_queue.setdefault(batch.queue, []).append((batch.id, batch.fence))
        released = 0
        for queue, items in by_queue.items():
            released += await self._script("release_batches", (self.keys(queue).batches,),
                                           argv("release_batches", items, owner=owner))
        return released

    # -- event subscriptions --------------------------------------------------------------

    def subscribe_call(self, subscriptions: Sequence[tuple[str, str, str]], ttl: float
                        ) -> ScriptCall:
        """Register or renew (event, subscriber, queue) subscriptions for `ttl` seconds."""
        return ("subscribe", (self.event_keys.subscribed,), argv(
            "subscribe", [(event, f"{subscriber} {queue}")
                          for event, subscriber, queue in subscriptions],
            ttl=max(int(ttl * 1000), 1)))

    async def subscribers(self, event: str) -> list[tuple[str, str]]:
        """(subscriber, queue) of each live subscription of `event`."""
        e = self.event_keys
        members = await self._script("subscribers", (e.subscribers(event), e.subscribed),
                                     argv("subscribers", event=event))
        return sorted(tuple(m.decode().split(" ", 1)) for m in members)
