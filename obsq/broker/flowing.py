"""The flows' side of Redis (chains and chords): write a flow, record a step's end and read
the steps it launches, mark them launched, cancel, read and delete a flow; each queue's flow
inbox, and the namespace's index of flows. A flow's own keys share its hash tag; a step's
task lives in its queue's slot, so a launch is two calls made safe by the order they run in
(obsq/producer/flow_steps.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from obsq.broker.calls import RedisCalls
from obsq.broker.keys import FlowKeys, QueueKeys
from obsq.broker.wire import REPLIES, argv, as_count, as_number, as_text, in_order
from obsq.errors import BrokerError, UnreadableRecord


class FlowState(NamedTuple):
    state: str  # running, completed, failed or cancelled
    failed: int | None  # the step that ended it
    error: str
    steps: int
    completed: int  # steps completed
    written: bytes | None  # ms
    ended: bytes | None  # ms
    current: int | None  # the step launched last
    current_queue: str
    result: bytes | None  # the last step's


class Flowing(RedisCalls):
    def flow_keys(self, flow_id: str) -> FlowKeys:
        return FlowKeys(self.namespace, flow_id)

    async def create_flow(self, flow_id: str, first: Sequence[int], fields: Sequence[Any],
                          written_ms: int, look_at_ms: int) -> bool:
        """Index the flow (the sweep looks at it at `look_at_ms`), then write it with its
        `first` steps launching; False when it existed. A flow refused (Redis above the
        producers' share) leaves the index: the sweep would find it gone before its end."""
        await self.index_flows("add", flow_id, written_ms, look_at_ms)
        k = self.flow_keys(flow_id)
        try:
            return bool(await self._script("flow_create", (k.flow, k.launching),
                                           argv("flow_create", share=self.memory_share,
                                                count=len(first), values=[*first, *fields])))
        except BrokerError as exc:
            if exc.out_of_memory:  # refused before anything was written
                await self.index_flows("remove", flow_id)
            raise

    async def flow_steps_ended(self, flow_id: str, ends: Sequence[tuple[int, str, bytes]]
                               ) -> tuple[str, bool, list[tuple[int, bytes]]]:
        """Record steps' ends (step, state, result or error): the flow's state ('' when it
        is gone after its end), whether this ended it, and the steps to launch (step,
        task). UnreadableRecord: the flow cannot be moved on (gone before its end, a key
        holding no hash, a field that does not parse), and why."""
        k = self.flow_keys(flow_id)
        reply = await self._script("flow_step", (k.flow, k.results, k.launching),
                                   argv("flow_step", ends))
        shape = REPLIES["flow_step"]
        head = shape.head_of(reply)
        if head.trouble:
            raise UnreadableRecord(as_text(head.trouble))
        try:
            launches = [(int(r.step), r.task) for r in shape.records(reply)]
        except ValueError:
            raise UnreadableRecord("its set of steps launching holds one that is not a "
                                   "step number") from None
        return as_text(head.state), head.ended == b"1", launches

    async def flow_launching(self, flow_id: str) -> tuple[str, list[tuple[int, bytes]]]:
        """The flow's state and the steps it has launching (those of a process that died
        before it enqueued them)."""
        state, _, launches = await self.flow_steps_ended(flow_id, ())
        return state, launches

    async def flow_launched(self, flow_id: str, steps: Sequence[int]) -> None:
        k = self.flow_keys(flow_id)
        await self._script("flow_launched", (k.flow, k.launching),
                           argv("flow_launched", steps=steps))

    async def cancel_flow(self, flow_id: str) -> tuple[str, list[tuple[int, str, str]]]:
        """End a running flow cancelled: the state it was in ('' for none), and its steps
        that may wait or run (step, queue, type)."""
        k = self.flow_keys(flow_id)
        reply = await self._script("flow_cancel", (k.flow, k.results, k.launching),
                                   argv("flow_cancel"))
        shape = REPLIES["flow_cancel"]
        steps = []
        for r in shape.records(reply):
            queue, _, task_type = r.where.decode().partition("\t")
            steps.append((int(r.step), queue, task_type))
        return as_text(shape.head_of(reply).state), steps

    async def flow_previous(self, flow_id: str, step: int
                            ) -> tuple[bool, str, list[bytes | None]]:
        """The results a step waited for: (it is a chord's callback, the steps it waited
        for, their results in order)."""
        k = self.flow_keys(flow_id)
        reply = await self._script("flow_previous", (k.flow, k.results),
                                   argv("flow_previous", step=step))
        shape = REPLIES["flow_previous"]
        head = shape.head_of(reply)
        return (head.chord == b"1", head.waited.decode(),
                [r.result for r in shape.records(reply)])

    async def flow_state(self, flow_id: str) -> FlowState | None:
        """Where a flow stands, without its steps; None when it is gone (or cannot be
        read: `flow_standing` says why)."""
        return (await self.flow_standing(flow_id))[0]

    async def flow_standing(self, flow_id: str) -> tuple[FlowState | None, str]:
        """(flow_state, why the flow is gone or unreadable when that is a fault, else '')."""
        k = self.flow_keys(flow_id)
        r = REPLIES["flow_state"].head_of(
            await self._script("flow_state", (k.flow, k.results), argv("flow_state")))
        if not r.state:
            return None, as_text(r.trouble or b"")
        return FlowState(as_text(r.state), as_number(r.failed), as_text(r.error),
                         as_count(r.steps), as_count(r.completed), r.written or None,
                         r.ended or None, as_number(r.current), as_text(r.current_queue),
                         r.result), ""

    async def flow_record(self, flow_id: str) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        """The flow's hash and its results ({} when it is gone)."""
        k = self.flow_keys(flow_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(k.flow)
        pipe.hgetall(k.results)
        return tuple(await self._guard("flow_info", pipe.execute()))

    async def delete_flow(self, flow_id: str) -> None:
        k = self.flow_keys(flow_id)
        await self._guard("flow_delete", self.redis.delete(k.flow, k.results, k.launching))
        await self.index_flows("remove", flow_id)

    async def tasks_exist(self, tasks: Sequence[tuple[str, str]]) -> list[bool]:
        """Whether each (queue, task id) has a task hash, in one round trip."""
        return await self._each_task(tasks, lambda pipe, k, task_id: pipe.exists(
            k.task(task_id)))

    async def tasks_running(self, tasks: Sequence[tuple[str, str]]) -> list[bool]:
        """Whether each (queue, task id) has an attempt running, in one round trip."""
        return await self._each_task(tasks, lambda pipe, k, task_id: pipe.hexists(
            k.active, task_id))

    async def _each_task(self, tasks: Sequence[tuple[str, str]],
                         ask: Callable[[Any, QueueKeys, str], Any]) -> list[bool]:
        if not tasks:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for queue, task_id in tasks:
            ask(pipe, self.keys(queue), task_id)
        return [bool(n) for n in await self._guard("flow_info", pipe.execute())]

    async def flow_ends(self, queue: str, count: int) -> list[bytes]:
        """The oldest `count` entries of the queue's flow inbox, oldest first."""
        return await self._script("flow_ends", (self.keys(queue).flow_inbox,),
                                  argv("flow_ends", mode="read", count=count))

    async def drop_flow_ends(self, queue: str, entries: Sequence[bytes]) -> None:
        await self._script("flow_ends", (self.keys(queue).flow_inbox,),
                           argv("flow_ends", mode="drop", entries=entries))

    async def flow_page(self, offset: int, count: int) -> tuple[int, list[str]]:
        """(flows kept, the ids of a page of them, the latest first)."""
        total, ids = await self.flow_ids(offset, count)
        return total, [as_text(i) for i in ids]

    async def flow_ids(self, offset: int, count: int) -> tuple[int, list[bytes]]:
        """flow_page's ids as the index holds them (one written by hand may be no text)."""
        shape = REPLIES["flow_index"]
        reply = await self.index_flows("page", offset, count)
        return int(shape.head_of(reply).total), [r.id for r in shape.records(reply)]

    async def set_flow_aside(self, flow_id: str | bytes, why: str) -> bool:
        """Take a flow out of the index into the flows set aside (`obsq doctor` lists them,
        the janitor forgets them with the dead tasks' keeping); False when it was there
        already."""
        return bool(await self.index_flows("junk", flow_id, why))

    async def flows_set_aside(self, cursor: str, count: int
                              ) -> tuple[str, list[tuple[bytes, int, str]]]:
        """A step of the flows set aside: (next cursor, '0' at the end; [(flow id as
        stored, when it was set aside (ms), why)])."""
        cursor_raw, *pairs = await self.index_flows("junked", cursor, count)
        found = []
        for flow_id, value in zip(pairs[::2], pairs[1::2]):
            at, _, why = as_text(value).partition(" ")
            found.append((flow_id, as_count(at.encode()), why))
        return as_text(cursor_raw), found

    async def index_flows(self, mode: str, *args: Any) -> Any:
        """flow_index.lua on the namespace's index of flows."""
        g = self.global_keys
        return await self._script("flow_index", (g.flows, g.flow_look, g.flow_junk),
                                  in_order("flow_index", mode, *args))
