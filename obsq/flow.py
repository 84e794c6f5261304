"""Workflows: a chain runs its steps one after another, each handler reading the previous
step's result as `task.previous`; a chord runs its members at once, then its callback, which
reads their results in order. Nesting is only a way of writing a flow: it is flattened here
into steps, each a task with the steps it waits for, which is all Redis keeps
(scripts/flow_*.lua). Every part of a flow ends in one step (a chain in its last step's, a
chord in its callback's), so what follows a part waits for that one step."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from obsq.names import queue_of
from obsq.task import Job, Task, TaskMessage, decode_stored_json, timestamp_to_datetime

FLOW_HEADER = "obsq-flow"  # "<flow id> <step>" on each step's task (enqueue.lua watches it)
__all__ = ["FLOW_HEADER", "Chain", "Chord", "FlowInfo", "StepFailure", "chain", "chord"]
# how a worker's record of a step's end ends a flow (or tells of a Client's cancel)
FLOW_OUTCOMES = ("completed", "failed", "cancelled")
FLOW_RETENTION = 3600.0  # how long an ended flow's state and results are kept (seconds)
# The sweep launches a flow's first steps this long after it was written if its producer did
# not (it died); a worker reads its flow inboxes at least every FLOW_SWEEP_INTERVAL (and at
# once after it ends a step), FLOW_BATCH entries a call; result() reads a running flow's
# state between FLOW_POLL_MIN and FLOW_POLL_MAX apart.
FLOW_LAUNCH_GRACE, FLOW_SWEEP_INTERVAL, FLOW_BATCH = 10.0, 1.0, 100
FLOW_POLL_MIN, FLOW_POLL_MAX = 0.005, 0.2
STEP_STATES = {"w": "waiting", "l": "launching", "r": "enqueued", "c": "completed",
               "d": "dead", "x": "cancelled"}


@dataclass(frozen=True)
class Chain:
    steps: tuple[Part, ...]
    retention: float = FLOW_RETENTION


@dataclass(frozen=True)
class Chord:
    members: tuple[Part, ...]
    callback: Part
    with_failures: bool = False
    retention: float = FLOW_RETENTION


Part = Job | Chain | Chord
Flow = Chain | Chord


def chain(*steps: Part, retention: float = FLOW_RETENTION) -> Chain:
    """Steps run one after another; each handler reads the previous result as
    `task.previous`. A step may be a chain or a chord. `retention`: seconds the flow's state
    and results are kept after it ends."""
    _check_parts(steps, "a chain needs at least one step")
    return Chain(tuple(steps), retention)


def chord(members: list[Part] | tuple[Part, ...], callback: Part, *,
          with_failures: bool = False, retention: float = FLOW_RETENTION) -> Chord:
    """`members` run at once; `callback` runs once after all completed, reading their results
    in order as `task.previous`. A member that ends dead fails the flow, unless
    `with_failures`: the callback then runs and finds a StepFailure in that member's place."""
    _check_parts(tuple(members), "a chord needs at least one member")
    _check_parts((callback,), "")
    return Chord(tuple(members), callback, with_failures, retention)


def _check_parts(parts: tuple[Any, ...], empty: str) -> None:
    if not parts:
        raise ValueError(empty)
    for part in parts:
        if not isinstance(part, (Job, Chain, Chord)):
            raise TypeError(f"a flow's step is an obsq.Job, chain or chord, not {part!r}")
        if isinstance(part, Job) and part.task_id is not None:
            raise ValueError("a flow names its steps' tasks itself: give no task_id")
        if isinstance(part, Job) and part.unique_for:
            # a step refused as a duplicate would leave its flow waiting for good
            raise ValueError("a flow's step cannot be unique (unique_for)")
        if isinstance(part, Job) and part.debounce_key is not None:
            # a step replaced by a later enqueue would leave its flow waiting for good
            raise ValueError("a flow's step cannot be debounced (debounce_key)")


@dataclass(frozen=True)
class StepFailure:
    """In a `with_failures` chord's task.previous, the place of a member that ended dead."""

    task_id: str
    error: str


@dataclass
class Step:
    """One step of a flattened flow: its job and the steps whose results it reads."""

    job: Job
    waits_for: list[int]
    many: bool  # reads a list of results (a chord's callback), else one (or None)
    with_failures: bool = False
    children: list[int] = field(default_factory=list)


def flatten(flow: Flow) -> tuple[list[Step], int]:
    """The flow's steps in order of writing, and its last step."""
    steps: list[Step] = []

    def add(part: Part, waits_for: list[int], many: bool, with_failures: bool) -> int:
        if isinstance(part, Job):
            steps.append(Step(part, waits_for, many, with_failures))
            for dep in waits_for:
                steps[dep].children.append(len(steps) - 1)
            return len(steps) - 1
        if isinstance(part, Chain):
            last = add(part.steps[0], waits_for, many, with_failures)
            for step in part.steps[1:]:
                last = add(step, [last], False, False)
            return last
        ends = [add(member, waits_for, many, with_failures) for member in part.members]
        return add(part.callback, ends, True, part.with_failures)

    return steps, add(flow, [], False, False)


def step_id(flow_id: str, step: int) -> str:
    return f"{flow_id}.{step}"


def step_of(task: Task) -> tuple[str, int] | None:
    """(flow id, step) when the task is a step of a flow."""
    flow_id, _, step = task.headers.get(FLOW_HEADER, "").partition(" ")
    return (flow_id, int(step)) if flow_id and step.isdigit() else None


def parse_step(task_id: str) -> tuple[str, int] | None:
    """(flow id, step) of a step's task id, or None for another id."""
    flow_id, _, step = task_id.rpartition(".")
    return (flow_id, int(step)) if flow_id and step.isdigit() else None


def stored_fields(steps: list[Step], messages: list[TaskMessage], last: int,
                  retention: float) -> list[Any]:
    """The flow hash's fields (flow_create.lua): per step its state, task, where it runs and
    what it waits for."""
    fields: list[Any] = ["nodes", len(steps), "tail", last, "ret", int(retention * 1000)]
    for n, (step, m) in enumerate(zip(steps, messages)):
        fields += [f"s:{n}", "l" if not step.waits_for else "w", f"m:{n}", encode_message(m),
                   f"q:{n}", f"{m.partition or m.queue}\t{m.type}"]
        if step.waits_for:
            fields += [f"d:{n}", " ".join(map(str, step.waits_for)),
                       f"left:{n}", len(step.waits_for)]
        if step.children:
            fields += [f"k:{n}", " ".join(map(str, step.children))]
        if step.many:
            fields += [f"v:{n}", "1"]
        if step.with_failures:
            fields += [f"tol:{n}", "1"]
    return fields


# The fields of a flow's hash that hold a number, and those that hold steps' numbers
NUMBER_FIELDS = ("nodes", "tail", "ret", "ndone", "failed", "cur", "left")
STEPS_FIELDS = ("d", "k")


def unreadable_field(f: dict[bytes, bytes]) -> str | None:
    """What of a flow's hash does not read as stored_fields wrote it and the scripts and
    workers read it (`obsq doctor`), else None: a number, a list of steps, or a step's task
    that does not decode."""
    for name, value in f.items():
        field = name.decode(errors="replace")
        kind = field.partition(":")[0]
        try:
            if kind in NUMBER_FIELDS:
                int(value)
            elif kind in STEPS_FIELDS:
                [int(n) for n in value.split()]
            elif kind == "m":
                decode_message(value)
        except (ValueError, KeyError, TypeError) as exc:
            return f"field {field} is {value[:40]!r}, which does not read: {exc!r}"
    return None


def encode_message(m: TaskMessage) -> bytes:
    """A step's task as the flow keeps it until it is enqueued."""
    return orjson.dumps({
        "id": m.id, "type": m.type, "queue": m.queue,
        "payload": base64.b64encode(m.payload).decode() if m.binary else m.payload.decode(),
        "binary": m.binary, "headers": m.headers, "max_retry": m.max_retry,
        "timeout": m.timeout, "retention": m.retention, "delay": m.delay,
        "unique_key": m.unique_key, "unique_for": m.unique_for,
        "ordering_key": m.ordering_key, "priority": m.priority, "partition": m.partition,
        "expires": m.expires, "fairness_key": m.fairness_key})


def decode_message(raw: bytes) -> TaskMessage:
    """encode_message's task; ValueError, KeyError or TypeError for what is not one."""
    d = orjson.loads(raw)
    if not all(isinstance(d[name], str) for name in ("id", "type", "queue", "payload")) or \
            not isinstance(d["headers"], dict):
        raise ValueError("not a step's task")
    payload = base64.b64decode(d["payload"]) if d["binary"] else d["payload"].encode()
    return TaskMessage(
        id=d["id"], type=d["type"], queue=d["queue"], payload=payload, headers=d["headers"],
        max_retry=d["max_retry"], timeout=d["timeout"], retention=d["retention"],
        delay=d["delay"], unique_key=d["unique_key"], unique_for=d["unique_for"],
        ordering_key=d["ordering_key"], priority=d.get("priority", 0), binary=d["binary"],
        id_chosen=True, partition=d.get("partition", ""), expires=d.get("expires", 0.0))


def previous_value(flow_id: str, waits_for: str, many: bool, raw: list[bytes | None]) -> Any:
    """task.previous from the results flow_previous.lua read: a failure kept for a
    `with_failures` chord ('!' and its error) becomes a StepFailure."""
    ids = waits_for.split()

    def one(i: int, value: bytes | None) -> Any:
        if value is not None and value.startswith(b"!"):
            return StepFailure(step_id(flow_id, int(ids[i])) if i < len(ids) else "",
                               value[1:].decode(errors="replace"))
        return decode_stored_json(value)

    values = [one(i, v) for i, v in enumerate(raw)]
    return values if many else (values[0] if values else None)


@dataclass
class FlowStep:
    index: int
    id: str  # its task's id
    queue: str
    type: str
    state: str  # waiting, launching, enqueued, running, completed, dead or cancelled
    waits_for: list[int]


@dataclass
class FlowInfo:
    """A flow as Redis holds it: `Client.result(info)` waits for its last step's result. A
    listing's (Inspector.flows) has no `steps`, only their count and how many completed."""

    id: str
    state: str  # running, completed, failed or cancelled
    steps: list[FlowStep]
    last_step: int
    failed_step: int | None = None
    error: str | None = None
    result: Any = None
    enqueued_at: datetime | None = None
    completed_at: datetime | None = None
    step_count: int = 0
    steps_completed: int = 0

    @classmethod
    def from_record(cls, flow_id: str, f: dict[bytes, bytes], results: dict[bytes, bytes]
                    ) -> FlowInfo:
        def text(name: str) -> str:
            return f.get(name.encode(), b"").decode(errors="replace")

        state = text("state") or "running"
        # a step that waited when its flow ended never runs: a cancelled flow's are cancelled
        unrun = "cancelled" if state == "cancelled" else "waiting"
        steps = []
        for n in range(int(text("nodes") or 0)):
            kept_in, _, task_type = text(f"q:{n}").partition("\t")
            code = text(f"s:{n}")
            steps.append(FlowStep(n, step_id(flow_id, n), queue_of(kept_in), task_type,
                                  unrun if code in ("", "w") else STEP_STATES.get(code, unrun),
                                  [int(d) for d in text(f"d:{n}").split()]))
        last = int(text("tail") or 0)
        failed = text("failed")
        return cls(id=flow_id, state=state, steps=steps, last_step=last,
                   failed_step=int(failed) if failed else None, error=text("error") or None,
                   result=decode_stored_json(results.get(str(last).encode())),
                   enqueued_at=timestamp_to_datetime(f.get(b"enq")),
                   completed_at=timestamp_to_datetime(f.get(b"done")), step_count=len(steps),
                   steps_completed=sum(s.state == "completed" for s in steps))
