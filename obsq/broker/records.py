"""What crosses the broker's boundary, as small typed records: the order of each Lua
script's arguments and reply is known here and in the broker method that calls it, and
nowhere else."""

from __future__ import annotations

from typing import NamedTuple


class FetchedTask(NamedTuple):
    """One attempt handed to a worker by dequeue.lua."""

    id: str
    fence: int  # the attempt's fencing token
    type: str
    payload: bytes
    headers: bytes  # JSON object, or b"" for none
    options: bytes  # JSON object of max_retry / timeout / retention, or b""
    retried: int
    due_ms: int  # when it became due, on Redis's clock
    id_chosen: bool  # the producer chose its id: it is remembered once the task is forgotten
    ordering_key: str  # "" when none
    waited: bool  # it waited for the tasks ahead of it on its ordering key
    slot: str  # the route whose concurrency limit it counts under, or ""
    binary: bool = False  # the payload is the producer's bytes, not JSON
    suspect: bool = False  # taken back from a lost worker beside others: it must run alone
    priority: int = 0  # 0 to 9 (obsq/task.py)


class Fetched(NamedTuple):
    """A dequeue's reply: Redis's clock (ms), the tasks it took, and the type and reason
    ('concurrency' or 'rate') of each task a route limit held back instead."""

    now_ms: int
    tasks: list[FetchedTask]
    held: tuple[tuple[str, str], ...] = ()
    asked_at: float = 0.0  # when the worker sent the call (time.monotonic())
    # a partition's fetch: the rank (ms, due - priority * aging) of its best task left, None
    # when none is; the worker takes a queue's partitions by it
    ahead_ms: int | None = None
    # the tasks it found past their expiry and ended dead instead (id, type, retried,
    # headers and priority only)
    expired: tuple[FetchedTask, ...] = ()


class Attempt(NamedTuple):
    """A running attempt, named by its task and fencing token, with what ending it gives
    back: its route slot, and (when it ends for good) its ordering key's turn."""

    task_id: str
    fence: int
    type: str = ""
    slot: str = ""
    ordering_key: str = ""


class Completion(NamedTuple):
    """A successful attempt to record (ack.lua)."""

    attempt: Attempt
    retention: float  # seconds to keep the result; 0 deletes the task at once
    result: bytes  # JSON
    id_chosen: bool = False  # the producer chose the id: remembered when the task is deleted


# queue -> the completions of that queue
Completions = dict[str, list[Completion]]


class Enqueued(NamedTuple):
    """How Redis took one message of an enqueue: `existing_id` names the task that holds
    its id or its unique lock when it was refused as a duplicate, or the waiting task of its
    debounce key when it replaced that task's payload (`debounced`)."""

    created: bool
    existing_id: str | None = None
    debounced: bool = False


class QueueStats(NamedTuple):
    depth: dict[str, int]  # tasks by state
    latency: float  # seconds since the oldest pending task became due
    paused: bool
    keys_waiting: int = 0  # fairness keys with waiting tasks
    # the TOP_FAIRNESS_KEYS of them with most waiting tasks: (key, tasks), most first
    top_keys: tuple[tuple[str, int], ...] = ()


class Ended(NamedTuple):
    """A watched task's end, as its waiting client reads it from its inbox."""

    queue: str
    task_id: str
    state: str  # completed | dead
    value: bytes  # the result (JSON) or the error text


class DueFires(NamedTuple):
    """What the scheduler holding the lock reads each round (due_fires.lua)."""

    now_ms: int  # Redis's clock
    version: int  # of the entries: changes when one is added, changed or removed
    soonest_ms: float | None  # the next fire after now (inf: only parked entries)
    due: list[tuple[str, float]]  # (name, next fire) of the entries due; 0: not picked up
    firing: dict[str, bytes]  # name -> claim ("<fire ms>[,...] <definition>") not confirmed


class ScheduleRecord(NamedTuple):
    """One entry of a listing (schedules.lua)."""

    name: str
    definition: bytes | None
    next_ms: float  # 0: not picked up by a scheduler yet; inf: parked as not valid
    last_ms: int | None
    claim: bytes | None
    fire_count: int
    missed_count: int


class GroupedTask(NamedTuple):
    """A grouped task as its batch holds it."""

    id: str
    payload: bytes
    headers: bytes  # JSON object, or b"" for none
    binary: bool  # the payload is the producer's own bytes, not JSON


class Batch(NamedTuple):
    """Grouped tasks claimed for one run of their aggregator (claim_batches.lua)."""

    id: str  # also the id of the task the aggregator makes of it
    queue: str
    type: str
    group: str
    fence: int  # of this claim: only it may end the batch
    failures: int  # earlier runs of the aggregator that failed
    tasks: list[GroupedTask]


class Claimed(NamedTuple):
    """A claim_batches reply: the batches, and the seconds until the next group or batch
    is due (None: none waits)."""

    batches: list[Batch]
    next_due: float | None


class GroupRecord(NamedTuple):
    """One group of a listing (groups.lua)."""

    type: str
    group: str
    size: int
    first_ms: int | None  # its oldest task's enqueue time, Redis's clock
    last_ms: int | None  # its newest task's


class BatchRecord(NamedTuple):
    """One batch of a listing (groups.lua); `readable` is False when its hash is not a hash
    (written by hand), and its other fields are then empty."""

    id: str
    claim_end_ms: int | None
    type: str
    group: str
    task_ids: list[str]
    owner: str  # the worker holding its claim; "" after a failure or a release
    failures: int
    error: str
    readable: bool = True


class GroupListing(NamedTuple):
    """A page of a queue's groups and a page of its batches, read in one step."""

    now_ms: int
    total: int  # groups
    next_offset: int | None
    batch_total: int
    next_batch_offset: int | None
    groups: list[GroupRecord]
    batches: list[BatchRecord]
