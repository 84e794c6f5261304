"""The producer's side of Redis: enqueue, read a task back, and wait for its end.

Waiting is multiplexed: a client registers in the queue's `watched` hash under its own
client id, and the scripts that end a task push the outcome onto that client's inbox
list (`<ns>:{<queue>}:inbox:<client id>`). One reader per client blocks on all of its
inboxes at once, so 2,000 waiters cost one connection, not 2,000.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from obsq.broker.calls import RedisCalls, ScriptCall
from obsq.broker.records import Ended, Enqueued
from obsq.broker.wire import LAYOUTS, REPLIES, EndEntry, argv
from obsq.names import stored_count
from obsq.settings import INBOX_BATCH, INBOX_TTL
from obsq.task import TaskMessage


class Producing(RedisCalls):
    async def register_queues(self, queues: Iterable[str]) -> None:
        """Add queues to the namespace's set (workers at start, producers for a new queue);
        never refused by a Redis at maxmemory (register.lua)."""
        await self._script(*self.register_queues_call(queues))

    async def enqueue(self, queue: str, messages: Sequence[TaskMessage], *,
                      continuing: bool = False) -> list[Enqueued]:
        """Write the messages of one queue in one script call (at most ENQUEUE_BATCH).
        `continuing`: they carry on work Redis accepted already (a flow's next steps), so,
        like a worker's own writes, only Redis's maxmemory refuses them, not the producers'
        share of it: a flow half done is not frozen by a Redis full of other data."""
        reply = await self._producer_script(*self.enqueue_call(queue, messages, continuing))
        return enqueue_statuses(reply, len(messages))

    def enqueue_call(self, queue: str, messages: Sequence[TaskMessage],
                     continuing: bool = False) -> ScriptCall:
        """enqueue.lua's call for the messages of one queue, whichever transport makes it
        (this broker, or the SyncClient's BlockingProducer); enqueue_statuses reads its
        reply. A batch none of whose messages gives a rarer option calls its plain variant
        (scripts.VARIANTS), which Redis runs for less."""
        k = self.keys(queue)
        keys = (k.pending, k.scheduled, k.wake)
        args = enqueue_args(messages, 1.0 if continuing else self.memory_share)
        if any(m.rare for m in messages):
            return ("enqueue", keys, args)
        return ("enqueue_plain", keys, args)

    async def partition_counts(self, queues: Sequence[str]) -> dict[str, int]:
        """The partition counts of queues as their workers declared them; 1 for a queue no
        worker declared, or whose entry is not a count."""
        key = self.global_keys.partitions
        found = await self._registry("partition_counts", key,
                                     self.redis.hmget(key, list(queues)), [None] * len(queues))
        return dict(zip(queues, map(stored_count, found)))

    async def find_queue(self, task_id: str, queues: Sequence[str] | None = None
                         ) -> str | None:
        """The queue (or partition) holding `task_id`, looked up in `queues`, else across
        every known queue."""
        if queues is None:
            queues = await self.queues()
        if not queues:
            return None
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.exists(self.keys(queue).task(task_id))
        found = await self._guard("find_queue", pipe.execute())
        return next((q for q, f in zip(queues, found) if f), None)

    async def queues(self) -> list[str]:
        key = self.global_keys.queues
        members = await self._registry("queues", key, self.redis.smembers(key), set())
        return sorted(m.decode() for m in members)

    async def task_fields(self, queue: str, task_id: str
                          ) -> tuple[dict[bytes, bytes], bytes | None]:
        """The task hash, its state as task_record gives it, and its progress."""
        fields, progress, _, _ = await self.task_record(queue, task_id)
        return fields, progress

    async def task_record(self, queue: str, task_id: str
                          ) -> tuple[dict[bytes, bytes], bytes | None, str, int | None]:
        """The task hash, its progress, the owner of a running attempt ('' when none) and
        its lease expiry (ms). The one place that says a task is active: while an attempt
        runs (its id in the queue's active hash, which dequeue.lua writes and every end or
        return of an attempt removes), whatever state its hash keeps from before (where it
        came from). Its hash is not written on each fetch: that cost a drain 4 % more of
        Redis's time (docs/internals/states.md)."""
        k = self.keys(queue)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(k.task(task_id))
        pipe.get(k.progress(task_id))
        pipe.hget(k.active, task_id)
        pipe.zscore(k.lease, task_id)
        fields, progress, owner, lease = await self._guard("task_info", pipe.execute())
        if fields and owner:
            fields[b"state"] = b"active"
        return (fields, progress, owner.decode(errors="replace") if owner else "",
                int(lease) if lease else None)

    async def cancel(self, queue: str, task_id: str) -> str:
        """Cancel a task: the state it ended or stays in ('cancelled', 'completed', 'dead'),
        'running' (its worker was told to stop it), or '' (no such task)."""
        k = self.keys(queue)
        state = await self._script("cancel", (k.pending, k.scheduled, k.retry, k.active,
                                              k.lease), argv("cancel", mode="task", id=task_id))
        return state.decode() if isinstance(state, bytes) else str(state)

    async def watch(self, queue: str, task_id: str, client_id: str
                    ) -> tuple[str, bytes | None, str | None] | None:
        """Ask to be told on `client_id`'s inbox when the task ends, and read its state in
        the same step: (state, result, error), or None when there is no such task. The
        state is as its hash keeps it: only whether it ended counts here (not whether it
        is active, which task_record says)."""
        k = self.keys(queue)
        reply = await self._script("watch", (k.watched, k.task(task_id)),
                                   argv("watch", id=task_id, client=client_id, watching=1))
        if reply is None:
            return None
        r = REPLIES["watch"].head_of(reply)
        return (r.state.decode() if r.state else "pending", r.result or None,
                r.error.decode(errors="replace") if r.error else None)

    async def unwatch(self, queue: str, task_id: str, client_id: str) -> None:
        k = self.keys(queue)
        await self._script("watch", (k.watched, k.task(task_id)),
                           argv("watch", id=task_id, client=client_id, watching=0))

    async def read_inbox(self, queues: Sequence[str], client_id: str, timeout: float
                         ) -> list[Ended]:
        """Block until tasks watched by `client_id` end in any of `queues` (or the wait is
        interrupted, or `timeout` passes); returns every end waiting in the inboxes. The
        inboxes of a Cluster live in different slots: one queue per call there."""
        if self.is_cluster and len(queues) > 1:
            raise ValueError("on a Redis Cluster, read one queue's inbox at a time")
        queue_of = {self.keys(q).inbox(client_id).encode(): q for q in queues}
        inboxes = [inbox.decode() for inbox in queue_of]
        pipe = self.redis.pipeline(transaction=False)
        pipe.blpop(inboxes, timeout=timeout)
        for inbox in inboxes:  # whatever else waits, in the same round trip
            pipe.lpop(inbox, INBOX_BATCH)
        first, *rest = await self._guard("read_inbox", pipe.execute(), wait=timeout)
        messages = [(queue_of[first[0]], first[1])] if first else []
        for queue, more in zip(queues, rest):
            messages += ((queue, m) for m in more or ())
        return _ends(messages)

    async def interrupt_inbox(self, queue: str, client_id: str) -> None:
        """End the client's read_inbox wait on `queue`'s inbox at once (it has another queue
        to listen to): an empty message, which read_inbox skips."""
        inbox = self.keys(queue).inbox(client_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(inbox, b"")
        pipe.expire(inbox, INBOX_TTL)
        await self._guard("read_inbox", pipe.execute())


ENQUEUE_LAYOUT = LAYOUTS["enqueue"]  # packed at every enqueue: without argv's lookup


def enqueue_args(messages: Sequence[TaskMessage], memory_share: float) -> list[Any]:
    """enqueue.lua's arguments: the producers' share of maxmemory, then each message's
    fields (wire.py's layout)."""
    return ENQUEUE_LAYOUT.pack([(m.id, m.type, m.payload, m.encoded_headers(),
                                 m.encoded_options(), int(m.delay * 1000),
                                 rare_options(m) if m.rare else b"")
                                for m in messages],
                               share=memory_share)


def rare_options(m: TaskMessage) -> bytes:
    """enqueue.lua's `rare` field of a message given any of the options few tasks are."""
    return ENQUEUE_LAYOUT.packed_value(
        "rare", own=int(m.id_chosen), binary=int(m.binary), unique=m.unique_key,
        unique_for=int(m.unique_for * 1000), ordering=m.ordering_key, priority=m.priority,
        expires=max(round(m.expires * 1000), 1) if m.expires else 0,
        debounce_key=m.debounce_key, debounce=max(round(m.debounce * 1000), 1)
        if m.debounce_key else 0, debounce_max=round(m.debounce_max * 1000),
        fairness=m.fairness_key)


def enqueue_statuses(reply: list[Any], count: int) -> list[Enqueued]:
    """enqueue.lua's reply (position, refusal, ...) as one status per message: a refusal is
    'id' (the id is taken) or 'unique:<holder>', and 'debounced:<task>' names the waiting
    task whose payload the message replaced; every other message was created."""
    statuses = [CREATED] * count
    if not reply:  # most enqueues: every message created, nothing to read
        return statuses
    for position, refusal in REPLIES["enqueue"].items(reply):
        kind, _, holder = refusal.decode().partition(":")
        statuses[int(position) - 1] = Enqueued(False, holder or None, kind == "debounced")
    return statuses


CREATED = Enqueued(True)


def _ends(messages: list[tuple[str, bytes]]) -> list[Ended]:
    """The ends in inbox messages `<id>\\n<state>\\n<value>`; empty ones only interrupted."""
    ends = []
    for queue, message in messages:
        if message:
            end = EndEntry.read(message)
            ends.append(Ended(queue, end.id, end.state, end.value))
    return ends
