"""What a task is, on both sides of Redis: the job a producer sends, the task a
handler receives, the info a client reads back, and the wire format between them.

Payloads, headers and results travel as JSON through orjson, never pickle, so
any language can produce or inspect them and a tampered entry fails loudly. A payload
given as bytes (the user's own serialization: protobuf, msgpack) is kept as it is, in a
field of its own, and reaches the handler as the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypedDict, overload

import orjson

from obsq.errors import PayloadError, Retry, TaskTooLarge
from obsq.names import check_seconds, duration, queue_of, validate_name
from obsq.payloads import PayloadType, Registration, registration_of
from obsq.settings import BYTES_SHOWN, DEFAULT_QUEUE, MAX_HEADERS_BYTES, MAX_PAYLOAD_BYTES

if sys.version_info >= (3, 13):
    from typing import TypeVar
else:  # a TypeVar's default (PEP 696): a bare `Task` is `Task[Any]`, under --strict too
    from typing_extensions import TypeVar

if TYPE_CHECKING:
    from typing_extensions import Unpack

PayloadT = TypeVar("PayloadT", default=Any)  # what a handler's `task.payload` is
ResultT = TypeVar("ResultT", default=Any)  # what a task's handler returns


def new_task_id() -> str:
    """128 random bits as 32 hex digits (a uuid4's entropy, a quarter of its cost)."""
    return os.urandom(16).hex()


def bytes_preview(data: bytes, size: int | None = None, shown: int = BYTES_SHOWN) -> str:
    """How the tools show a bytes payload: its size and the base64 of its first bytes
    (`size`: of the whole payload, when `data` is only its head)."""
    size = len(data) if size is None else size
    head = base64.b64encode(data[:shown]).decode()
    return f"<{size:,} bytes, base64> {head}" + ("..." if size > shown else "")


def encode_json(value: Any, what: str) -> bytes:
    """JSON, refusing what JSON cannot say: orjson would write NaN and infinities as null,
    and a `datetime` as text that reads back as a str. Payloads and results both pass here."""
    try:
        encoded = orjson.dumps(value, default=_model_fields,
                               option=orjson.OPT_PASSTHROUGH_DATETIME)
    except TypeError as exc:
        raise TypeError(f"{what} is not JSON-serializable: {exc}") from None
    if b"null" in encoded and _has_non_finite(value):  # the walk only when it may matter
        raise ValueError(f"{what} holds NaN or an infinity, which JSON cannot represent")
    # orjson writes into a 1 KB bytes object and shrinks it in place: kept, a short one
    # leaves a hole behind it that the next 1 KB buffer does not fit, so a batch's payloads
    # spread over the heap, which glibc trims and faults in again at the next batch (9,000
    # page faults a 10,000-task enqueue_many, 15 % of its time). A copy of its own size comes
    # from Python's small-object allocator, and the buffer is reused at once.
    return bytes(memoryview(encoded)) if len(encoded) < 1024 else encoded


def _model_fields(value: Any) -> Any:
    """What orjson cannot write itself: a pydantic model (a result, or inside a payload) as
    its JSON fields, found by its method so that pydantic is never imported here."""
    dump = getattr(value, "model_dump", None)
    if dump is None:
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
    return dump(mode="json")


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


class EnqueueOptions(TypedDict, total=False):
    """The options of one enqueue (Client.enqueue, Job), each None for its default: the
    route's, else the Client's."""

    queue: str | None
    max_retry: int | None
    timeout: float | None
    delay: float | timedelta | None
    eta: datetime | timedelta | None
    unique_for: float | timedelta | None
    task_id: str | None
    retention: float | timedelta | None
    headers: dict[str, str] | None
    ordering_key: str | None  # tasks sharing it run one at a time, in enqueue order
    priority: int | None  # 0 to 9, higher first within its queue (None: the route's)
    # not started by then, it never runs: seconds or a timedelta from the enqueue, or an
    # aware datetime (None: the route's, else never)
    expires: float | timedelta | datetime | None
    # latest wins: enqueues of its type and queue sharing the key run once, `debounce` s
    # after the last (at most `debounce_max` after the first), with the last payload
    debounce_key: str | None
    debounce: float | timedelta | None
    debounce_max: float | timedelta | None
    # the tasks of different keys start in turn within their queue (None: the route's)
    fairness_key: str | None


# What a handler is to a type checker: a function of `Task[P]` returning R (or a coroutine
# of R). The overloads below make `Job(handler, payload)` a Job[R], its payload checked.
PayloadIn = TypeVar("PayloadIn")
ResultOut = TypeVar("ResultOut")
AsyncHandler = Callable[["Task[PayloadIn]"], Awaitable[ResultOut]]
PlainHandler = Callable[["Task[PayloadIn]"], ResultOut]


@dataclass(init=False, slots=True)
class Job(Generic[ResultT]):
    """One task to enqueue, by its type name or its registered handler (`Job(send_email,
    Email(...))`: a Job[Sent], its payload checked against the handler's); the options left
    as None take the route's or the client's defaults."""

    type: str
    payload: Any = None
    queue: str | None = None
    max_retry: int | None = None
    timeout: float | None = None
    delay: float | timedelta | None = None
    eta: datetime | timedelta | None = None
    unique_for: float | timedelta | None = None
    task_id: str | None = None
    retention: float | timedelta | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ordering_key: str | None = None  # tasks sharing it run one at a time, in enqueue order
    priority: int | None = None  # 0 to 9, higher first within its queue (None: the route's)
    # not started by then, it never runs: seconds or a timedelta from the enqueue, or an aware
    # datetime (None: the route's, else never)
    expires: float | timedelta | datetime | None = None
    # latest wins: the tasks of its type and queue enqueued with the same debounce_key run
    # once, `debounce` seconds after the last of them (at most `debounce_max` after the
    # first), with the last one's payload (None: the route's debounce)
    debounce_key: str | None = None
    debounce: float | timedelta | None = None
    debounce_max: float | timedelta | None = None
    # the tasks of different keys start in turn within their queue (None: the route's)
    fairness_key: str | None = None
    # the headers of the tasks this one is made of (an aggregation): its trace links to theirs
    origins: list[dict[str, str]] = field(default_factory=list)
    # the handler's declared types, when given by its handler (obsq/payloads.py)
    registration: Registration | None = field(default=None, repr=False, compare=False)

    @overload
    def __init__(self: Job[ResultOut], type: AsyncHandler[PayloadIn, ResultOut],
                 payload: PayloadIn, **options: Unpack[EnqueueOptions]) -> None: ...
    @overload
    def __init__(self: Job[ResultOut], type: PlainHandler[PayloadIn, ResultOut],
                 payload: PayloadIn, **options: Unpack[EnqueueOptions]) -> None: ...
    @overload
    def __init__(self: Job[Any], type: str, payload: Any = None, *,
                 origins: list[dict[str, str]] | None = None,
                 **options: Unpack[EnqueueOptions]) -> None: ...

    def __init__(self, type: str | Callable[..., Any], payload: Any = None, *,
                 queue: str | None = None, max_retry: int | None = None,
                 timeout: float | None = None, delay: float | timedelta | None = None,
                 eta: datetime | timedelta | None = None,
                 unique_for: float | timedelta | None = None, task_id: str | None = None,
                 retention: float | timedelta | None = None,
                 headers: dict[str, str] | None = None, ordering_key: str | None = None,
                 priority: int | None = None,
                 expires: float | timedelta | datetime | None = None,
                 debounce_key: str | None = None, debounce: float | timedelta | None = None,
                 debounce_max: float | timedelta | None = None,
                 fairness_key: str | None = None,
                 origins: list[dict[str, str]] | None = None) -> None:
        self._fill(type, payload, queue, max_retry, timeout, delay, eta, unique_for, task_id,
                   retention, headers, ordering_key, priority, expires, debounce_key, debounce,
                   debounce_max, fairness_key, origins)

    def _fill(self, type: str | Callable[..., Any], payload: Any, queue: str | None,
              max_retry: int | None, timeout: float | None, delay: float | timedelta | None,
              eta: datetime | timedelta | None, unique_for: float | timedelta | None,
              task_id: str | None, retention: float | timedelta | None,
              headers: dict[str, str] | None, ordering_key: str | None, priority: int | None,
              expires: float | timedelta | datetime | None, debounce_key: str | None,
              debounce: float | timedelta | None, debounce_max: float | timedelta | None,
              fairness_key: str | None, origins: list[dict[str, str]] | None) -> None:
        """Every field, given by position in __init__'s order: Client.enqueue makes its Job
        without matching eighteen keywords (a third of a microsecond per enqueue)."""
        if callable(type):
            self.registration = registration_of(type)
            self.type = self.registration.task_type(type)
        else:
            self.registration = None
            self.type = type
        self.payload = payload
        self.queue = queue
        self.max_retry = max_retry
        self.timeout = timeout
        self.delay = delay
        self.eta = eta
        self.unique_for = unique_for
        self.task_id = task_id
        self.retention = retention
        self.headers = dict(headers) if headers else {}
        self.ordering_key = ordering_key
        self.priority = priority
        self.expires = expires
        self.debounce_key = debounce_key
        self.debounce = debounce
        self.debounce_max = debounce_max
        self.fairness_key = fairness_key
        self.origins = list(origins) if origins else []


@dataclass(slots=True)
class TaskMessage:
    """A job checked and encoded for the broker: every field is final and valid.
    build_message makes it by position: a field added is added to its call too."""

    id: str
    type: str
    queue: str
    payload: bytes  # JSON, or the producer's own bytes when `binary`
    headers: dict[str, str]
    max_retry: int | None  # None: the worker applies the route's default
    timeout: float | None
    retention: float
    delay: float  # seconds from when Redis receives it; 0 means now
    unique_key: str  # digest of type + payload, empty when not unique
    unique_for: float
    ordering_key: str = ""
    priority: int = 0
    fairness_key: str = ""  # "" when none: the tasks without a key take their turn as one key
    binary: bool = False  # the payload was given as bytes and stays bytes
    id_chosen: bool = False  # the producer named the id: Redis must check that it is free
    origins: list[dict[str, str]] = field(default_factory=list)  # Job.origins; not stored
    partition: str = ""  # the partition of its queue it goes to (obsq/producer/enqueue.py), or ""
    result_type: PayloadType | None = None  # its handler's declared result; not stored
    expires: float = 0.0  # seconds from when Redis receives it to its expiry; 0: never
    debounce_key: str = ""  # Job.debounce_key, or "" when not debounced
    debounce: float = 0.0  # seconds
    debounce_max: float = 0.0  # seconds; 0: no bound

    def encoded_headers(self) -> bytes:
        return orjson.dumps(self.headers) if self.headers else b""

    def encoded_options(self) -> bytes:
        """JSON of the options that differ from the defaults, or b"" when none does."""
        # max_retry=0 is a real choice (no retries): only None means "the route's default"
        options = {"max_retry": self.max_retry, "timeout": self.timeout,
                   "retention": self.retention or None}
        chosen = {k: v for k, v in options.items() if v is not None}
        return orjson.dumps(chosen) if chosen else b""

    @property
    def rare(self) -> bool:
        """Whether it is given any of the options few tasks are (enqueue.lua's `rare`)."""
        return bool(self.id_chosen or self.binary or self.unique_key or self.ordering_key
                    or self.priority or self.expires or self.debounce_key
                    or self.fairness_key)


def build_message(job: Job, *, queue: str | None = None, max_retry: int | None = None,
                  timeout: float | None = None, now: float | None = None,
                  max_payload: int = MAX_PAYLOAD_BYTES, priority: int | None = None,
                  declared: Registration | None = None, expires: float | None = None,
                  debounce: float | None = None, debounce_max: float | None = None,
                  fairness_key: str | None = None) -> TaskMessage:
    """Check every option and encode the payload before anything is written to Redis;
    a payload over `max_payload` bytes (encoded) or headers over MAX_HEADERS_BYTES raise
    TaskTooLarge, one that cannot become its handler's payload type (`declared`: the
    route's, unless the job was given by its handler) PayloadError. `debounce`,
    `debounce_max`: the route's, for a job that gives none."""
    validate_name("task type", job.type)
    declared = job.registration or declared
    value = job.payload
    if declared is not None and declared.payload is not None:
        value = declared.payload.encode(value, f"the payload of task {job.type!r}")
    # each option the job's, else the route's (a conditional, not a call: per enqueue)
    queue = validate_name("queue", job.queue if job.queue is not None else
                          queue if queue is not None else DEFAULT_QUEUE)
    max_retry = job.max_retry if job.max_retry is not None else max_retry
    if max_retry is not None and (not isinstance(max_retry, int) or max_retry < 0):
        raise ValueError(f"max_retry must be a non-negative integer, got {max_retry!r}")
    timeout = job.timeout if job.timeout is not None else timeout
    if timeout is not None:
        check_seconds("timeout", timeout)
    if job.delay is not None and job.eta is not None:
        raise ValueError("give delay or eta, not both")
    # each check a call only where an option is given: the common enqueue gives none
    delay = 0.0 if job.delay is None else duration("delay", job.delay, minimum=0.0)
    if isinstance(job.eta, timedelta):  # a length of time: from now, as a delay
        delay = duration("eta", job.eta, minimum=0.0)
    elif job.eta is not None and not isinstance(job.eta, datetime):
        raise TypeError(f"eta must be a datetime (aware, or naive in local time) or a "
                        f"timedelta from now, got {type(job.eta).__name__} {job.eta!r}")
    elif job.eta is not None:  # the only place the producer's clock counts: eta means its "now"
        # a naive datetime is local time, as Python's datetime.now() makes and reads it
        delay = max(job.eta.timestamp() - (time.time() if now is None else now), 0.0)
    retention = 0.0 if job.retention is None else duration("retention", job.retention)
    expires_in = 0.0
    if job.expires is not None:
        expires_in = expiry(job.expires, time.time() if now is None else now)
    elif expires is not None:
        expires_in = expires
    unique_for = 0.0 if job.unique_for is None else duration("unique_for", job.unique_for)
    if job.task_id is not None:
        validate_name("task_id", job.task_id)
    headers = dict(job.headers or {})
    if headers:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise TypeError("headers must map strings to strings")
        _within(job.type, "headers", len(orjson.dumps(headers)), MAX_HEADERS_BYTES)
    binary = isinstance(value, (bytes, bytearray, memoryview))
    if isinstance(value, str) or binary:  # never smaller encoded: refuse before
        _within(job.type, "payload", len(value), max_payload)  # encoding
    payload = bytes(value) if binary else encode_json(value, "payload")
    _within(job.type, "payload", len(payload), max_payload)
    priority = job.priority if job.priority is not None else priority
    priority = 0 if priority is None else check_priority(priority)
    ordering_key = ""
    if job.ordering_key is not None:
        ordering_key = validate_name("ordering_key", job.ordering_key)
    fairness_key = job.fairness_key if job.fairness_key is not None else fairness_key
    fairness_key = "" if not fairness_key else validate_name("fairness_key", fairness_key)
    unique_key = ""
    if unique_for:
        # bytes are told apart from the JSON that happens to have the same text; JSON is
        # compared in a canonical form, so the order of an object's keys makes no other task
        kind = b"\0bytes\0" if binary else b"\0"
        canonical = payload if binary else orjson.dumps(value, default=_model_fields,
                                                        option=orjson.OPT_SORT_KEYS)
        unique_key = hashlib.sha1(job.type.encode() + kind + canonical).hexdigest()
    debounced: tuple[str, float, float | None] = ("", 0.0, None)
    if (debounce is not None or job.debounce_key is not None or job.debounce is not None
            or job.debounce_max is not None):
        debounced = check_debounce(job, debounce, debounce_max)
        delay = debounced[1]  # a burst's first enqueue: due a window later
    # by position, in TaskMessage's field order (keywords cost each enqueue 0.8 µs more);
    # the result type is read back as the handler's only when enqueued by the handler (a
    # TaskInfo[R]): by name the result stays its JSON value
    return TaskMessage(job.task_id or new_task_id(), job.type, queue, payload, headers,
                       max_retry, timeout, retention, delay, unique_key, unique_for,
                       ordering_key, priority, fairness_key, binary, job.task_id is not None,
                       list(job.origins), "",
                       job.registration.result if job.registration else None, expires_in,
                       debounced[0], debounced[1], debounced[2] or 0.0)


def expiry(value: float | timedelta | datetime, now: float) -> float:
    """`expires=` as seconds from the enqueue: a number of seconds or a timedelta above 0,
    or an aware datetime still to come (the producer's clock at `now` counts, as for eta);
    else ValueError or TypeError saying what it may be."""
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise ValueError(f"expires must be an aware datetime (with a tzinfo), got the naive "
                             f"{value.isoformat()}")
        seconds = value.timestamp() - now
        if seconds <= 0:
            raise ValueError(f"expires {value.isoformat()} has passed already")
        check_seconds("expires (from now)", seconds)
        return seconds
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expires must be seconds, a timedelta or an aware datetime, got "
                        f"{type(value).__name__} {value!r}")
    check_seconds("expires", value)
    return float(value)


def check_debounce(job: Job, debounce: float | None, debounce_max: float | None
                   ) -> tuple[str, float, float | None]:
    """The job's debounce key, window and bound (seconds; the route's `debounce` and
    `debounce_max` when it gives none), or ValueError/TypeError: a debounced task needs a
    key and a window, and takes no option that would name or time it otherwise."""
    window = job.debounce if job.debounce is not None else debounce
    most = job.debounce_max if job.debounce_max is not None else debounce_max
    if job.debounce_key is None:
        if job.debounce is None and job.debounce_max is None:
            raise ValueError(f"tasks of type {job.type!r} are debounced (its route's "
                             f"debounce={debounce:g}): give each enqueue a debounce_key")
        raise ValueError("debounce and debounce_max need a debounce_key: the name of the "
                         "tasks that run once per burst")
    key = validate_name("debounce_key", job.debounce_key)
    if window is None:
        raise ValueError("debounce_key needs debounce=<seconds>: how long after the last "
                         "enqueue with the key its task runs")
    window, most = check_debounce_times(window, most)
    taken = [name for name, value in (("delay", job.delay), ("eta", job.eta),
                                      ("unique_for", job.unique_for),
                                      ("task_id", job.task_id),
                                      ("ordering_key", job.ordering_key)) if value is not None]
    if taken:
        raise ValueError(f"a debounced task takes no {', '.join(taken)}: its debounce key "
                         "names it and the last enqueue times it")
    return key, window, most


def check_debounce_times(debounce: float | timedelta, debounce_max: float | timedelta | None
                         ) -> tuple[float, float | None]:
    """`debounce` and `debounce_max` in seconds, or ValueError: both above 0, and the bound
    no shorter than the window."""
    window = debounce.total_seconds() if isinstance(debounce, timedelta) else debounce
    check_seconds("debounce", window)
    if debounce_max is None:
        return float(window), None
    most = debounce_max.total_seconds() if isinstance(debounce_max, timedelta) else debounce_max
    check_seconds("debounce_max", most)
    if most < window:
        raise ValueError(f"debounce_max ({most:g} s) must be at least debounce ({window:g} s): "
                         "it bounds the wait from a burst's first enqueue")
    return float(window), float(most)


def _within(task_type: str, what: str, size: int, limit: int) -> None:
    if size > limit:
        raise TaskTooLarge(f"the {what} of task {task_type!r} (at least {size:,} bytes "
                           f"encoded) is over the limit of {limit:,} bytes; store large data "
                           "elsewhere and send a reference" + (
                               " (or raise max_payload on the App or the route)"
                               if what == "payload" else ""))


@dataclass(slots=True)
class AttemptState:
    """What the engine knows of one attempt beside what its handler sees, in one place
    (`task._attempt`): set by the stage that learns it, read by the ones after. `task.context`
    is the user's (middleware and hooks) alone."""

    fence: int = 0  # the attempt's fencing token: every script that ends it checks it
    slot: str = ""  # the route whose concurrency limit (in Redis) it counts under
    id_chosen: bool = False  # its producer chose the id (remembered after its end)
    suspect: bool = False  # it ran beside others when a worker was lost: it runs alone
    flow_step: bool = False  # a step of a flow (its headers name the flow)
    asked_at: float = 0.0  # when its fetch was asked (monotonic): were the claims in doubt since?
    fetched_at: float | None = None  # when it entered the buffer (monotonic), while it waits
    own_limit: str | None = None  # the worker's own route limit it counts under, while it runs
    counted: bool = False  # the throughput counter counted its outcome
    # why it could not be built from what Redis keeps (a stored option that is not a
    # number): it ends dead without its handler running
    unreadable: Exception | None = None


class Task(Generic[PayloadT]):
    """A task as its handler sees it; `Task[P]`: its payload is a P (obsq/payloads.py), a
    bare `Task` takes any JSON value. Decoding the payload is deferred to first use so a
    tampered payload, or one that no longer decodes into P, fails inside the handler chain,
    where it is reported like any error (PayloadError: dead, no retries)."""

    __slots__ = (
        "_attempt",
        "_binary",
        "_headers",
        "_loop",
        "_payload",
        "_payload_type",
        "_raw_headers",
        "_raw_payload",
        "_update_state",
        "cancelled",
        "context",
        "id",
        "max_retry",
        "ordering_key",
        "partition",
        "previous",
        "priority",
        "queue",
        "retention",
        "retry_count",
        "route",
        "timeout",
        "type",
        "wait_seconds",
    )

    def __init__(self, *, id: str, type: str, queue: str, raw_payload: bytes,
                 raw_headers: bytes, retry_count: int, max_retry: int, timeout: float,
                 retention: float, wait_seconds: float = 0.0, route: str = "other",
                 ordering_key: str = "", binary: bool = False, previous: Any = None,
                 partition: str = "", priority: int = 0, attempt: AttemptState | None = None,
                 update_state: Callable[[Task[Any], Any], Coroutine[Any, Any, None]] | None
                 = None, payload_type: PayloadType | None = None) -> None:
        """`payload_type`: its handler's (the route's), which the payload is read as."""
        self.id = id
        self.type = type
        self.queue = queue
        self.partition = partition  # the partition of its queue holding it (app.queue), or ""
        self.priority = priority  # 0 to 9, higher first within its queue
        self.retry_count = retry_count
        self.max_retry = max_retry
        self.timeout = timeout
        self.retention = retention
        self.wait_seconds = wait_seconds
        self.route = route  # the matched route pattern: a bounded label for metrics
        self.ordering_key = ordering_key  # it runs alone among the tasks sharing this key
        self.previous = previous  # a flow's step: the result(s) of the step(s) before it
        # Set when the task was cancelled while this attempt ran, or it overran its timeout in
        # a thread: an async handler gets CancelledError, a plain one should look and return.
        self.cancelled = False
        self.context: dict[str, Any] = {}  # per-attempt scratch space for middleware and hooks
        self._attempt = AttemptState() if attempt is None else attempt  # the engine's
        self._raw_payload = raw_payload
        self._binary = binary  # the payload is the producer's bytes: handed over as they are
        self._raw_headers = raw_headers
        self._payload: Any = _UNSET
        self._payload_type = payload_type
        self._headers: dict[str, str] | None = None
        self._update_state = update_state
        self._loop = running_loop()  # the worker's: a plain handler's progress goes there

    @property
    def kept_in(self) -> str:
        """The queue whose Redis keys hold it: its partition, else its queue."""
        return self.partition or self.queue

    @property
    def payload(self) -> PayloadT:
        """The value given at enqueue, decoded as its handler's payload type (the JSON value
        itself for an untyped handler); the bytes, when bytes were given."""
        if self._payload is _UNSET:
            try:
                value = self._raw_payload if self._binary else orjson.loads(self._raw_payload)
            except orjson.JSONDecodeError as exc:
                raise PayloadError(f"payload of task {self.id} does not decode: {exc}") from None
            if self._payload_type is not None:
                value = self._payload_type.decode(value, f"the payload of task {self.id}")
            self._payload = value
        return self._payload  # type: ignore[no-any-return]

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            try:
                decoded = orjson.loads(self._raw_headers) if self._raw_headers else {}
            except orjson.JSONDecodeError:
                decoded = None
            self._headers = decoded if isinstance(decoded, dict) else {}
        return self._headers

    def update_state(self, state: Any) -> Awaitable[None]:
        """Publish progress; clients read it with `Client.info(id).progress`. An async
        handler awaits it; a plain handler (a thread of the worker) just calls it: the
        write is sent to the worker's event loop and the call returns once it is done."""
        if self._update_state is None:
            raise RuntimeError("update_state is only available inside a worker")
        return written_from_here(self._update_state(self, state), self._loop)

    def portable(self) -> dict[str, Any]:
        """What builds this task again in another process (`Task(**fields)`): every
        argument of its constructor but update_state, the engine's attempt state and the
        payload type (the other process's App has its own), the payload and headers as
        Redis gave them."""
        return {name: getattr(self, _STORED_AS.get(name, name)) for name in _PORTABLE}

    def retry_in(self, seconds: float) -> NoReturn:
        """Hand the task back, due again in `seconds`; counts as a retry (as in Celery).

        It raises, so `await task.retry_in(60)` and a plain call both leave the handler."""
        raise Retry(seconds)

    def __repr__(self) -> str:
        return f"Task(id={self.id!r}, type={self.type!r}, queue={self.queue!r})"


_UNSET = object()

_STORED_AS = {"raw_payload": "_raw_payload", "raw_headers": "_raw_headers", "binary": "_binary"}
_PORTABLE = tuple(name for name in inspect.signature(Task.__init__).parameters
                  if name not in ("self", "update_state", "attempt", "payload_type"))


@dataclass(slots=True)
class TaskInfo(Generic[ResultT]):
    """A task as Redis holds it, read back by a client. `TaskInfo[R]`: the task of a handler
    returning R, as enqueueing by its handler gives it (`client.result(info)` is an R).
    info_after_enqueue makes it by position: a field added is added to its call too."""

    id: str
    type: str
    queue: str
    state: str
    retry_count: int = 0
    priority: int = 0  # 0 to 9, higher first within its queue
    max_retry: int | None = None  # None: the route's default applies
    error: str | None = None
    result: Any = None
    progress: Any = None
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    enqueued_at: datetime | None = None
    next_run_at: datetime | None = None
    completed_at: datetime | None = None
    duplicate: bool = False  # enqueue_many: a unique or id conflict; id is the existing task
    # an enqueue with a debounce_key that replaced the payload of its key's waiting task,
    # whose id this is (a first enqueue of a burst created the task: False)
    debounced: bool = False
    partition: str = ""  # the partition of its queue that holds it (app.queue), or ""
    # its handler's declared result type, when it was enqueued by its handler:
    # client.result(info) reads the result back as it
    result_type: PayloadType | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_fields(cls, task_id: str, queue: str, f: dict[bytes, bytes],
                    progress: bytes | None) -> TaskInfo[Any]:
        """The task as its hash in Redis (and its progress key) describe it; junk written
        there by hand reads as text, not a crash. `queue`: where it was read, a queue or
        one of its partitions."""
        def text(name: bytes) -> str | None:
            value = f.get(name)
            return value.decode(errors="replace") if value is not None else None

        options = decode_stored_json(f.get(b"opts")) or {}
        state = text(b"state") or "pending"
        headers = decode_stored_json(f.get(b"headers"))
        return cls(
            id=task_id, type=text(b"type") or "", queue=queue_of(queue), state=state,
            partition=queue if queue_of(queue) != queue else "",
            retry_count=_number(f.get(b"retried")), priority=_number(f.get(b"pri")),
            max_retry=options.get("max_retry") if isinstance(options, dict) else None,
            error=text(b"error") or None, result=decode_stored_json(f.get(b"result")),
            progress=decode_stored_json(progress),
            payload=f[b"bin"] if b"bin" in f else decode_stored_json(f.get(b"payload")),
            headers=headers if isinstance(headers, dict) else {},
            enqueued_at=timestamp_to_datetime(f.get(b"enq")),
            next_run_at=timestamp_to_datetime(f.get(b"due")) if state in ("scheduled",
                                                                            "retry") else None,
            completed_at=timestamp_to_datetime(f.get(b"done")))


def decode_stored_json(raw: bytes | None) -> Any:
    """Stored results and progress are shown even when a tool wrote junk into them."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


def timestamp_to_datetime(ms: bytes | str | int | None) -> datetime | None:
    if ms in (None, b"", ""):
        return None
    try:
        return datetime.fromtimestamp(int(float(ms)) / 1000, tz=timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None  # a tampered field


def _number(raw: bytes | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0


# A task's priority within its queue: 0 to 9, higher first, 0 by default. A task of priority
# p waits in its queue's list for p (`pending` for 0, `pending:<p>` else); a fetch serves
# the best ranked head first, a task pending for w seconds ranking as p + w / aging
# (WorkerSettings.priority_aging), so a low priority ages into the higher ones
# (docs/internals/fetching.md).
PRIORITIES = range(10)


def check_priority(value: Any) -> int:
    """`value` as a priority, or ValueError/TypeError saying what one is (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an integer from 0 to 9 (higher runs first), got "
                        f"{value!r}")
    if value not in PRIORITIES:
        raise ValueError(f"priority must be from 0 to 9 (higher runs first), got {value!r}")
    return value


# How `task.update_state` reaches the worker's event loop from wherever a handler runs: an
# async handler awaits the write on the loop itself; a plain one, in a thread of the worker,
# cannot await, so its call hands the write to the loop and waits for it there.
def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def written_from_here(write: Coroutine[Any, Any, None],
                      loop: asyncio.AbstractEventLoop | None) -> Awaitable[None]:
    """`write` for the caller to await when it runs on `loop` (or there is none to reach),
    else run on `loop` and waited for now, its result an awaitable already done."""
    if loop is None or running_loop() is loop:
        return write
    asyncio.run_coroutine_threadsafe(write, loop).result()
    return _Done()


class _Done:
    """The write is done: nothing warns when this is dropped, and awaiting it is harmless."""

    def __await__(self) -> Generator[Any, Any, None]:
        yield from ()
