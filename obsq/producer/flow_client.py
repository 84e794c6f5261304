"""A Client's flows: enqueue a chain or chord, read where it stands, wait for its result,
cancel and delete it (Client's enqueue, info, result, cancel and delete given a flow).

Every step's task is checked and passes the producer hooks (trace context, counts) when the
flow is enqueued, so a flow is refused whole or written whole, and traced as one batch: one
trace, a message span per step, each linked to those of the steps it waits for. The flow is
indexed, then written with its first steps launching, then those are enqueued: a producer
that dies in between leaves them to the flow sweep (FlowLoop)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from obsq.broker import Enqueued
from obsq.errors import (
    FlowCancelled,
    FlowFailed,
    ResultTimeout,
    TaskFailed,
    TaskNotFound,
    TaskRunning,
)
from obsq.flow import (
    FLOW_HEADER,
    FLOW_LAUNCH_GRACE,
    FLOW_POLL_MAX,
    FLOW_POLL_MIN,
    Flow,
    FlowInfo,
    encode_message,
    flatten,
    step_id,
    stored_fields,
)
from obsq.producer.enqueue import ProducerChain, info_after_enqueue
from obsq.producer.flow_steps import launch
from obsq.producer.results import waited_too_long
from obsq.settings import RESULT_RECHECK
from obsq.task import (
    TaskInfo,
    TaskMessage,
    decode_stored_json,
    new_task_id,
    timestamp_to_datetime,
)

if TYPE_CHECKING:
    from obsq.broker import Broker
    from obsq.producer.client import Client

P = ParamSpec("P")
T = TypeVar("T")


def or_flow(method: Callable[Concatenate[Client, str, P], Coroutine[Any, Any, T]]
            ) -> Callable[Concatenate[Client, str | FlowInfo, P], Coroutine[Any, Any, T]]:
    """Client's info, cancel or delete of a task given a flow instead: its FlowInfo, or its id
    (flow and task ids come from one generator), looked for only once no task has it and no
    queue was named, so a task's call costs nothing more."""
    by_task: Callable[..., Coroutine[Any, Any, T]] = method  # (client, task_id, queue)

    @functools.wraps(method)
    async def call(client: Client, task_id: str | FlowInfo, queue: str | None = None) -> Any:
        flow_method = getattr(client.flows, method.__name__)
        if isinstance(task_id, FlowInfo):
            return await flow_method(task_id.id)
        try:
            return await by_task(client, task_id, queue)
        except TaskNotFound:
            if await client.flows.named(task_id, queue):
                return await flow_method(task_id)
            raise

    return cast("Callable[Concatenate[Client, str | FlowInfo, P], Coroutine[Any, Any, T]]",
                call)


class ClientFlows:
    """A Client's calls for flows only (`client.flows`), by flow id: what the Client's enqueue,
    info, result, cancel and delete do when given a flow, and a listing of the flows kept."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.broker: Broker = client.broker

    async def enqueue(self, flow: Flow) -> FlowInfo:
        """Check every step, pass them through the producer hooks, write the flow and
        enqueue its first steps."""
        steps, last = flatten(flow)
        flow_id = new_task_id()
        now = self.broker.clock.time()
        messages = self.client.step.prepare([step.job for step in steps], now)
        for n, m in enumerate(messages):
            m.id, m.id_chosen = step_id(flow_id, n), True
            m.headers[FLOW_HEADER] = f"{flow_id} {n}"
            # the steps it waits for come first: a tracing hook has put its trace context in
            # their headers when it reaches this one, whose span then links to theirs
            m.origins = [messages[d].headers for d in steps[n].waits_for]
        first = [n for n, step in enumerate(steps) if not step.waits_for]

        async def store(checked: list[TaskMessage]) -> list[TaskInfo]:
            await self.client.plan(checked)
            await self.broker.create_flow(
                flow_id, first, stored_fields(steps, checked, last, flow.retention),
                int(now * 1000), int((now + FLOW_LAUNCH_GRACE) * 1000))
            await launch(self.broker, flow_id, [(n, encode_message(checked[n]))
                                                for n in first], continuing=False)
            return [info_after_enqueue(m, Enqueued(True)) for m in checked]

        await ProducerChain(store, self.client)(*self.client.producer_hooks)(messages)
        return await self.info(flow_id, running=False)

    async def named(self, task_id: str, queue: str | None) -> bool:
        """Whether the id no task has is a flow's (never when a task's queue was named)."""
        return queue is None and await self.broker.flow_state(task_id) is not None

    async def info(self, flow_id: str, running: bool = True) -> FlowInfo:
        """The flow and its steps; with `running`, an enqueued step whose task runs says so
        (one more round trip, when any step is enqueued)."""
        fields, results = await self.broker.flow_record(flow_id)
        if not fields:
            raise TaskNotFound(f"no flow {flow_id!r} (an ended flow is kept for its "
                               "retention)")
        info = FlowInfo.from_record(flow_id, fields, results)
        enqueued = [s for s in info.steps if s.state == "enqueued"] if running else []
        for step, runs in zip(enqueued, await self.broker.tasks_running(
                [(s.queue, s.id) for s in enqueued])):
            step.state = "running" if runs else step.state
        return info

    async def page(self, limit: int = 20, offset: int = 0) -> tuple[int, list[FlowInfo]]:
        """The number of flows kept, and a page of them, the latest first, without their
        steps (one gone since it was listed is left out)."""
        total, ids = await self.broker.flow_page(offset, limit)
        flows = []
        for flow_id in ids:
            s = await self.broker.flow_state(flow_id)
            if s is not None:
                flows.append(FlowInfo(
                    flow_id, s.state, [], -1, s.failed, s.error or None,
                    decode_stored_json(s.result), timestamp_to_datetime(s.written),
                    timestamp_to_datetime(s.ended), s.steps, s.completed))
        return total, flows

    async def result(self, flow_id: str, timeout: float | None) -> Any:
        """Its last step's result, once the flow completed; FlowFailed when a step ended it
        (or it was cancelled). Waits for the step launched last to end (the Client's result
        wait, no polling while it runs), then reads where the flow stands, more seldom the
        longer nothing moves (a worker records the end moments later)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, waited = FLOW_POLL_MIN, None
        while True:
            s = await self.client.deadlines.run("flow_state", self.broker.flow_state(flow_id))
            if s is None:
                raise TaskNotFound(f"no flow {flow_id!r}")
            if s.state == "completed":
                return decode_stored_json(s.result)
            if s.state == "cancelled" and s.failed is None:  # by Client.cancel, not a step
                raise FlowCancelled(flow_id)
            if s.state in ("failed", "cancelled"):
                raise FlowFailed(flow_id, flow_id if s.failed is None else step_id(
                    flow_id, s.failed), s.error or s.state)
            left = RESULT_RECHECK if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise waited_too_long(flow_id, timeout or 0, "flow")
            if s.current is not None and s.current != waited:
                waited, pause = s.current, FLOW_POLL_MIN
                try:
                    await self.client.results.wait(s.current_queue, step_id(
                        flow_id, s.current), min(left, RESULT_RECHECK))
                except ResultTimeout:
                    waited = None  # it still runs: look at the flow, then wait again
                except (TaskFailed, TaskNotFound):
                    pass  # it ended: its flow hears of it in a moment
                continue
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, FLOW_POLL_MAX)

    async def cancel(self, flow_id: str) -> str:
        """End a running flow cancelled and cancel its enqueued steps; the state it was in."""
        state, steps = await self.broker.cancel_flow(flow_id)
        if not state:
            raise TaskNotFound(f"no flow {flow_id!r}")
        for n, queue, _ in steps:
            await self.broker.cancel(queue, step_id(flow_id, n))
        return state

    async def delete(self, flow_id: str) -> str:
        """Delete an ended flow and its steps' tasks; TaskRunning while it runs."""
        info = await self.info(flow_id)
        if info.state == "running":
            raise TaskRunning(f"flow {flow_id} is running: cancel it first")
        for step in info.steps:
            if step.state != "waiting":
                await self.broker.delete_task(step.queue, step.id)
        await self.broker.delete_flow(flow_id)
        return info.state

