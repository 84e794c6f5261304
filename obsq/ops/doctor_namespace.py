"""What `obsq doctor` (obsq/ops/doctor.py) checks beyond the queues, in the order of this file:
the flows, and the live workers whose loops stand still; and the notices of what the workers
and --repair set aside (the queues' junk, the flows set aside)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from obsq.broker.wire import EndEntry
from obsq.flow import FlowInfo, unreadable_field
from obsq.inspection.partition_view import readable

if TYPE_CHECKING:
    from obsq.broker import Broker

STEP = 1000  # ids per script call: bounds how long one step holds Redis
EXAMPLES = 5  # ids named per problem
# seconds a live worker's event loop, or its fetch loop past its longest wait, may stand
# still before it is reported: the heartbeat's TTL, after which the worker would count as
# lost were its heartbeat on that loop
STALL_LIMIT = 10.0


# A problem of the flows: what, a few examples, the flow (or step) ids, and for a flow that
# cannot be moved on why (else no whys)
FlowProblem = tuple[str, list[str], list["str | bytes"], list[str]]


async def check_flows(broker: Broker, queues: list[str]
                      ) -> tuple[list[FlowProblem], list[str]]:
    """The flows' problems and notes. A flow that cannot be moved on (its record
    unreadable, a field that does not parse, or gone though it had not ended: deleted
    outside obsq) is a problem, --repair sets it aside; so is a running flow's enqueued
    step whose task is gone with no end waiting in its queue's flow inbox (it can never
    end: --repair records it dead, which fails the flow). Ends waiting in flow inboxes,
    steps left launching and index entries of flows gone after their end are information
    (the workers' FlowLoop mends them)."""
    waiting: set[str] = set()
    notes = []
    for queue in queues:
        entries = await broker.flow_ends(queue, STEP)
        waiting |= {EndEntry.read(e).id for e in entries}
        if entries:
            notes.append(f"{readable(queue)}: {len(entries)} flow step end(s) not yet "
                         "recorded in their flow (a worker's FlowLoop records them)")
    gone, launching, suspects = 0, 0, []
    unreadable: list[tuple[str | bytes, str]] = []
    for raw in await _flow_ids(broker):
        try:
            flow_id = raw.decode()
        except UnicodeDecodeError:
            unreadable.append((raw, "not a flow id (its bytes are no text)"))
            continue
        summary, trouble = await broker.flow_standing(flow_id)
        if trouble:
            unreadable.append((flow_id, trouble))
            continue
        if summary is None:
            gone += 1
        if summary is None or summary.state != "running":
            continue
        fields, results = await broker.flow_record(flow_id)
        if not fields:  # ended and gone since
            continue
        why = unreadable_field(fields)
        try:
            info = FlowInfo.from_record(flow_id, fields, results)
        except (ValueError, KeyError, TypeError) as exc:
            why = why or f"its record does not read: {exc!r}"
        if why:
            unreadable.append((flow_id, why))
            continue
        launching += sum(s.state == "launching" for s in info.steps)
        enqueued = [s for s in info.steps if s.state == "enqueued" and s.id not in waiting]
        found = await broker.tasks_exist([(s.queue, s.id) for s in enqueued])
        suspects += [(flow_id, s) for s, there in zip(enqueued, found) if not there]
    lost = []
    for flow_id, step in suspects:  # read again: its end may have been recorded since
        fields, results = await broker.flow_record(flow_id)
        current = FlowInfo.from_record(flow_id, fields, results) if fields else None
        if current is not None and current.state == "running" and \
                current.steps[step.index].state == "enqueued" and \
                not (await broker.tasks_exist([(step.queue, step.id)]))[0]:
            lost.append(step.id)
    notes += [f"{gone} flow(s) indexed and gone after their end (the flow sweep forgets "
              "them)"] if gone else []
    notes += [f"{launching} flow step(s) launching (the flow sweep enqueues them)"] \
        if launching else []
    problems: list[FlowProblem] = []
    if unreadable:
        problems.append(("flows that cannot be moved on (their later steps never run)",
                         [f"{_text(f)}: {why}" for f, why in unreadable[:EXAMPLES]],
                         [f for f, _ in unreadable], [why for _, why in unreadable]))
    if lost:
        problems.append(("steps of running flows whose task is gone (the flow cannot end)",
                         lost[:EXAMPLES], list(lost), []))
    return problems, notes


async def _flow_ids(broker: Broker) -> list[bytes]:
    ids: list[bytes] = []
    while True:
        total, page = await broker.flow_ids(len(ids), STEP)
        ids += page
        if not page or len(ids) >= total:
            return ids


def _text(flow_id: str | bytes) -> str:
    return flow_id.decode(errors="replace") if isinstance(flow_id, bytes) else flow_id


async def stalled_workers(broker: Broker) -> tuple[list[str], list[str]]:
    """The live workers whose heartbeat is current while their event loop or fetch loop has
    stood still for STALL_LIMIT: they serve nothing (their description says how long each
    loop stands still: Worker.describe). (Their ids, each said with its stall.)"""
    ids, said = [], []
    for worker in await broker.workers():
        stalled = worker.get("stalled") or {}
        loops = {loop: float(seconds) for loop, seconds in stalled.items()
                 if isinstance(seconds, (int, float)) and seconds >= STALL_LIMIT}
        if loops:
            ids.append(str(worker.get("id")))
            said.append(f"{worker.get('id')} (" + ", ".join(
                f"{loop.replace('_', ' ')} still for {seconds:.0f} s"
                for loop, seconds in sorted(loops.items())) + ")")
    return ids, said


async def aside_notices(broker: Broker, queues: list[str]) -> list[str]:
    """What the workers and --repair set aside, each kept for an operator to read: the
    queues' junk (the janitor deletes it, records and all, with the dead tasks' keeping)
    and the flows set aside."""
    notices = []
    for queue in queues:
        cursor, found = "0", []
        while True:
            cursor, page = await broker.junk(queue, cursor, STEP)
            found += page
            if cursor == "0":
                break
        if found:
            notices.append(f"{readable(queue)}: {len(found)} record(s) set aside in the "
                           "queue's junk (deleted with the dead tasks' keeping): " + "; ".join(
                               f"{name}: {why}" for name, _, why in found[:EXAMPLES]))
    cursor, flows = "0", []
    while True:
        cursor, flow_page = await broker.flows_set_aside(cursor, STEP)
        flows += flow_page
        if cursor == "0":
            break
    if flows:
        notices.append(f"flows: {len(flows)} flow(s) set aside (deleted with the dead tasks' "
                       "keeping): " + "; ".join(f"{_text(f)}: {why}"
                                                for f, _, why in flows[:EXAMPLES]))
    return notices

