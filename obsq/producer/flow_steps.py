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
twice and none is lost.

A flow whose record cannot be read (a key holding no hash, a field that does not parse),
or is gone though it had not ended (deleted outside obsq), costs only itself: it is set
aside (`set_aside`), said once, and the other flows move on."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from obsq.broker.wire import EndEntry, as_text
from obsq.errors import UnreadableRecord
from obsq.flow import decode_message, parse_step
from obsq.producer.enqueue import group_by_queue
from obsq.settings import ENQUEUE_BATCH

if TYPE_CHECKING:
    from obsq.broker import Broker
    from obsq.task import TaskMessage

log = logging.getLogger("obsq")


async def set_aside(broker: Broker, flow_id: str | bytes, why: object) -> None:
    """Take the flow out of the index into the flows set aside, saying so once (whoever
    sets it aside first)."""
    if await broker.set_flow_aside(flow_id, str(why)):
        log.warning("flow %s set aside in the flows' junk: %s; its steps not yet run never "
                    "run (`obsq doctor` lists it)", as_text(flow_id), why)


async def launch(broker: Broker, flow_id: str, steps: Sequence[tuple[int, bytes]], *,
                 continuing: bool = True) -> None:
    """Enqueue the steps' tasks (their queues registered first), then mark them launched.
    `continuing`: the flow was accepted before (False: its producer launches its first
    steps as it creates it, held to the producers' share of Redis's memory as any enqueue)."""
    if not steps:
        return
    by_queue = group_by_queue([_step_task(n, m) for n, m in steps if m])
    if by_queue:
        await broker.register_queues(by_queue)
    for queue, messages in by_queue.items():
        for start in range(0, len(messages), ENQUEUE_BATCH):
            await broker.enqueue(queue, messages[start:start + ENQUEUE_BATCH],
                                 continuing=continuing)
    await broker.flow_launched(flow_id, [n for n, _ in steps])


def _step_task(step: int, stored: bytes) -> TaskMessage:
    """The task a flow keeps for a step; UnreadableRecord naming the field when it does not
    decode into one."""
    try:
        return decode_message(stored)
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableRecord(f"field m:{step} (the task of step {step}) does not decode: "
                               f"{exc!r}") from None


async def record_ends(broker: Broker, entries: Sequence[bytes]) -> list[str]:
    """Record flow inbox entries (`<task id>\\n<state>\\n<value>`) in their flows, one call
    per flow, and launch what they complete: the states of the flows they ended. An entry of
    no flow is passed over, one of a flow that cannot be moved on sets it aside."""
    by_flow: dict[str, list[tuple[int, str, bytes]]] = {}
    for entry in entries:
        end = EndEntry.read(entry)
        step = parse_step(end.id)
        if step is not None and end.state:
            by_flow.setdefault(step[0], []).append((step[1], end.state, end.value))
    ended = []
    for flow_id, ends in by_flow.items():
        try:
            state, done, launches = await broker.flow_steps_ended(flow_id, ends)
            await launch(broker, flow_id, launches)
        except UnreadableRecord as exc:
            await set_aside(broker, flow_id, exc)
            continue
        if done:
            ended.append(state)
    return ended


async def relaunch(broker: Broker, flow_id: str) -> str:
    """Launch the steps a flow left launching (its producer or a worker died before it
    enqueued them); the flow's state ('' when it is gone after its end). UnreadableRecord
    when the flow cannot be moved on."""
    state, launches = await broker.flow_launching(flow_id)
    await launch(broker, flow_id, launches)
    return state
