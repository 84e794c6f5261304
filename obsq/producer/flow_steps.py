"""Moving a flow on, from any process: launch the steps a flow decided on, and record the
end of a step read from its queue's flow inbox.

A step's end reaches its flow in two steps, as the flow's keys and the step's queue live
in different Cluster slots: the script that ends the task writes the end into the queue's
flow inbox in the same step (notify_done), and a worker's FlowLoop records it in the flow
(flow_step.lua, which marks the steps it completes as launching), enqueues those steps and
marks them launched (flow_launched.lua), and only then removes the inbox entry. A process
killed anywhere in between leaves the entry (or the flow's launching steps) for the next:
recording an end twice changes nothing, and a step's task has a fixed id that its queue
refuses while the task exists and for the dedup window after it ended, so no step runs
twice and none is lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from obsq.broker.wire import EndEntry
from obsq.flow import decode_message, parse_step
from obsq.producer.enqueue import group_by_queue
from obsq.settings import ENQUEUE_BATCH

if TYPE_CHECKING:
    from obsq.broker import Broker


async def launch(broker: Broker, flow_id: str, steps: Sequence[tuple[int, bytes]], *,
                 continuing: bool = True) -> None:
    """Enqueue the steps' tasks (their queues registered first), then mark them launched.
    `continuing`: the flow was accepted before (False: its producer launches its first
    steps as it creates it, held to the producers' share of Redis's memory as any enqueue)."""
    if not steps:
        return
    by_queue = group_by_queue([decode_message(m) for _, m in steps if m])
    if by_queue:
        await broker.register_queues(by_queue)
    for queue, messages in by_queue.items():
        for start in range(0, len(messages), ENQUEUE_BATCH):
            await broker.enqueue(queue, messages[start:start + ENQUEUE_BATCH],
                                 continuing=continuing)
    await broker.flow_launched(flow_id, [n for n, _ in steps])


async def record_ends(broker: Broker, entries: Sequence[bytes]) -> list[str]:
    """Record flow inbox entries (`<task id>\\n<state>\\n<value>`) in their flows, one call
    per flow, and launch what they complete: the states of the flows they ended. An entry of
    no flow is passed over."""
    by_flow: dict[str, list[tuple[int, str, bytes]]] = {}
    for entry in entries:
        end = EndEntry.read(entry)
        step = parse_step(end.id)
        if step is not None and end.state:
            by_flow.setdefault(step[0], []).append((step[1], end.state, end.value))
    ended = []
    for flow_id, ends in by_flow.items():
        state, done, launches = await broker.flow_steps_ended(flow_id, ends)
        await launch(broker, flow_id, launches)
        if done:
            ended.append(state)
    return ended


async def relaunch(broker: Broker, flow_id: str) -> str:
    """Launch the steps a flow left launching (its producer or a worker died before it
    enqueued them); the flow's state ('' when it is gone)."""
    state, launches = await broker.flow_launching(flow_id)
    await launch(broker, flow_id, launches)
    return state
