"""The App: which handler runs a task type, and what wraps every handler.

Routing: an exact type wins, then the longest registered prefix (a pattern ending
in ":" or "."), then the catch-all "*". Middleware is a Starlette-style onion:
`async def mw(task, call_next)`; the first one added is the outermost.
Hooks report what happens outside a handler: each attempt's outcome once Redis has
recorded it, tasks taken back from lost workers, and failed Redis calls.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from obsq.errors import ConfigurationError, StartupError
from obsq.names import (
    check_partitions,
    check_seconds,
    parse_rate,
    subscriber_task_type,
    validate_name,
    validate_namespace,
)
from obsq.payloads import PayloadType, Registration, register
from obsq.schedule import Schedule
from obsq.settings import (
    AGGREGATE_GRACE_PERIOD,
    AGGREGATE_MAX_DELAY,
    AGGREGATE_MAX_SIZE,
    DEFAULT_QUEUE,
    MAX_PAYLOAD_BYTES,
)
from obsq.task import (
    Job,
    Task,
    TaskInfo,
    TaskMessage,
    check_debounce_times,
    check_priority,
    expiry,
)

log = logging.getLogger("obsq")
Handler = Callable[[Task[Any]], Any]
# what @app.task returns: the handler itself, its type (its payload, its result) kept
HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])
CallNext = Callable[[Task[Any]], Awaitable[Any]]
Middleware = Callable[[Task[Any], CallNext], Awaitable[Any]]
RetryDelay = float | Callable[[int, BaseException, Task[Any]], float] | None
CallNextProducer = Callable[[list[TaskMessage]], Awaitable[list[TaskInfo[Any]]]]
ProducerHook = Callable[[list[TaskMessage], CallNextProducer], Awaitable[list[TaskInfo[Any]]]]
OutcomeHook = Callable[[Task[Any], str, BaseException | None], None]
RecoveryHook = Callable[[str, str, int], None]
RedisErrorHook = Callable[[str, BaseException], None]
RefusalHook = Callable[[Job[Any], Exception], None]
FlowHook = Callable[[str], None]
ThrottleHook = Callable[[str, str, str], None]
StuckHook = Callable[[int], None]
RecycleHook = Callable[[str], None]
AggregationHook = Callable[[str, str, str], None]
# aggregator(group, tasks) -> (task type, payload), or an obsq.Job; may be async
Aggregator = Callable[[str, list[Task[Any]]], Any]

# -- hooks: the one way obsq calls them -------------------------------------------------------
# A hook is told what happened; it never decides what happens. So a hook that raises is
# logged, with its traceback, the first time it fails (later failures of the same hook at
# DEBUG, so a hook broken for every task does not flood the log), and obsq goes on as if it
# had returned: a failed Redis call's error, a worker's health, a settle, a sweep are the
# same with or without it, on every thread that calls hooks (the event loop, the heartbeat
# thread, a SyncClient's caller). Middleware and producer hooks wrap a call and may change
# it on purpose: they are onions, not hooks, and are not called through here.

P = ParamSpec("P")




class Hooks(list[Callable[P, object]], Generic[P]):
    """The hooks of one kind, in the order added; `hooks(*args)` calls each, guarded."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind  # as the log names it: "outcome hook", "Redis-error hook", ...
        self._failed: set[int] = set()  # ids of the hooks whose failure was logged

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for hook in self:
            try:
                hook(*args, **kwargs)
            except Exception:
                if id(hook) in self._failed:
                    log.debug("%s %r failed again", self.kind, hook, exc_info=True)
                else:
                    self._failed.add(id(hook))
                    log.exception("%s %r failed; obsq goes on without it (later failures "
                                  "of this hook are logged at DEBUG)", self.kind, hook)


OUTCOMES = ("success", "retry", "dead", "cancelled", "expired", "requeued", "lease_lost",
            "unrecorded")
RECOVERY_REASONS = ("expired", "worker_lost")
THROTTLE_REASONS = ("concurrency", "rate", "ordering")
AGGREGATION_OUTCOMES = ("success", "failed")


@dataclass(frozen=True)
class Route:
    pattern: str
    handler: Handler
    is_async: bool
    queue: str | None = None
    max_retry: int | None = None
    timeout: float | None = None
    retry_delay: RetryDelay = None
    concurrency: int | None = None  # attempts running at once across all workers
    rate: float | None = None  # starts per second across all workers
    max_payload: int | None = None  # bytes of its encoded payload (None: the App's limit)
    priority: int | None = None  # its tasks' priority in their queue (None: 0)
    expires: float | None = None  # seconds from its tasks' enqueue to their expiry (None: never)
    # seconds: its tasks are debounced (each enqueue gives its debounce_key), and bounded
    debounce: float | None = None
    debounce_max: float | None = None
    # its tasks' fairness key, from the payload given to enqueue (None: no key)
    fairness_key: Callable[[Any], str] | None = None
    key_concurrency: int | None = None  # attempts of one fairness key at once, all workers
    key_rate: float | None = None  # starts per second of one fairness key, all workers
    declared: Registration | None = None  # its handler's payload and result types

    @property
    def payload_type(self) -> PayloadType | None:
        """What its tasks' payloads are read as (None: the JSON value, unchecked)."""
        return self.declared.payload if self.declared is not None else None


@dataclass(frozen=True)
class Aggregation:
    """How grouped tasks of the types `pattern` covers become one task."""

    pattern: str
    aggregator: Aggregator
    max_size: int  # a group this large is aggregated at once (and batches hold at most this)
    max_delay: float  # seconds from a group's oldest task to its aggregation, at most
    grace_period: float  # a group that got no task for this long is aggregated


@dataclass(frozen=True)
class Subscription:
    """A subscriber of an event: its copies are tasks of type `<event>@<name>`."""

    event: str
    name: str
    queue: str

    @property
    def task_type(self) -> str:
        return subscriber_task_type(self.event, self.name)


class App:
    """The registry of handlers, middleware and outcome hooks shared by workers and clients."""

    def __init__(self, namespace: str = "obsq", *,
                 max_payload: int = MAX_PAYLOAD_BYTES) -> None:
        """`max_payload`: the largest encoded payload its Clients enqueue, in bytes (a
        route may set its own)."""
        self.namespace = validate_namespace(namespace)
        self.max_payload = _byte_limit(max_payload)
        self._routes: PatternTable[Route] = PatternTable()
        self.middleware: list[Middleware] = []
        # hooks, each kind called through obsq/app.py, Hooks (a hook that raises changes nothing)
        self.outcome_hooks: Hooks[[Task[Any], str, BaseException | None]] = Hooks(
            "outcome hook")
        self.recovery_hooks: Hooks[[str, str, int]] = Hooks("recovery hook")
        self.redis_error_hooks: Hooks[[str, BaseException]] = Hooks("Redis-error hook")
        self.throttle_hooks: Hooks[[str, str, str]] = Hooks("throttle hook")
        self.producer_hooks: list[ProducerHook] = []  # around every Client built with it
        self.refusal_hooks: Hooks[[Job[Any], Exception]] = Hooks("refusal hook")  # Clients'
        self.schedules: dict[str, Schedule] = {}  # the entries of app.periodic, by name
        self._aggregations: PatternTable[Aggregation] = PatternTable()
        self.aggregation_hooks: Hooks[[str, str, str]] = Hooks("aggregation hook")
        self.subscriptions: dict[str, Subscription] = {}  # by the copies' task type
        self.import_path: str | None = None  # "module:attribute", when load_app loaded it
        self.stuck_hooks: Hooks[[int]] = Hooks("stuck-slots hook")
        self.recycle_hooks: Hooks[[str]] = Hooks("recycle hook")
        self.flow_hooks: Hooks[[str]] = Hooks("flow hook")
        self.partitions: dict[str, int] = {}  # queue -> partitions, of app.queue
        # queue -> {fairness key: tasks it takes per turn}, of app.fairness_weights
        self.weights_by_queue: dict[str, dict[str, int]] = {}

    def queue(self, name: str, *, partitions: int = 1) -> None:
        """Declare a queue stored as `partitions` partitions (obsq/names.py): on a
        Redis Cluster they spread over its masters, so one hot queue uses all of them. Its
        workers write the count to Redis, where producers without this App read it."""
        self.partitions[validate_name("queue", name)] = check_partitions(partitions)

    def fairness_weights(self, queue: str, weights: Mapping[str, int]) -> None:
        """In `queue`, each fairness key named takes that many tasks per turn (1 for the
        keys not named; the tasks without a key as the key ""): the shares of a drain that
        every key keeps busy. Its workers apply them (this App's)."""
        for key, weight in weights.items():
            if not isinstance(key, str) or isinstance(weight, bool) or \
                    not isinstance(weight, int) or not 1 <= weight <= 1000:
                raise ValueError(f"a fairness weight is a whole number from 1 to 1000 for a "
                                 f"key, got {key!r}: {weight!r}")
        self.weights_by_queue[validate_name("queue", queue)] = dict(weights)

    def task(self, pattern: str, *, queue: str | None = None, max_retry: int | None = None,
             timeout: float | None = None, retry_delay: RetryDelay = None,
             concurrency: int | None = None, rate_limit: str | None = None,
             max_payload: int | None = None, priority: int | None = None,
             expires: float | timedelta | None = None,
             debounce: float | timedelta | None = None,
             debounce_max: float | timedelta | None = None,
             fairness_key: Callable[[Any], str] | None = None,
             key_concurrency: int | None = None, key_rate_limit: str | None = None
             ) -> Callable[[HandlerT], HandlerT]:
        """Register a handler for a task type, a prefix ending in ':' or '.', or '*'; the
        handler is returned as it is, so `client.enqueue(handler, payload)` is type-checked
        against its `task: obsq.Task[P]` and its result. Its payload type is read from that
        annotation now (obsq/payloads.py).
        `concurrency`: at most this many of its attempts run at once, across all workers;
        `rate_limit` ('100/s', '30/m', '5/h'): its starts across all workers stay within it.
        Both are kept per queue, in the queue's Redis keys. `max_payload`: the largest
        encoded payload of its tasks, in bytes, instead of the App's. `priority` (0-9,
        higher first): its tasks' default priority within their queue. `expires` (seconds or
        a timedelta): its tasks not started that long after their enqueue never run.
        `debounce` (and `debounce_max`): every enqueue of its tasks gives a `debounce_key`
        and is debounced by these, unless it gives its own. `fairness_key`: a
        cheap function of the payload given to enqueue that names its task's fairness key
        when the enqueue names none (the tasks of different keys start in turn).
        `key_concurrency` and `key_rate_limit` hold as `concurrency` and `rate_limit` do, for
        the tasks of each fairness key apart (tasks without a key are not counted)."""
        validate_name("task type", pattern)
        if fairness_key is not None and not callable(fairness_key):
            raise TypeError(f"fairness_key must be a function of the payload, got "
                            f"{fairness_key!r}")
        for name, limit in (("concurrency", concurrency), ("key_concurrency", key_concurrency)):
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                      or limit < 1):
                raise ValueError(f"{name} must be a positive integer, got {limit!r}")
        rate = parse_rate(rate_limit) if rate_limit is not None else None
        key_rate = parse_rate(key_rate_limit) if key_rate_limit is not None else None
        if max_payload is not None:
            _byte_limit(max_payload)
        if priority is not None:
            check_priority(priority)
        if queue is not None:
            validate_name("queue", queue)
        if max_retry is not None and (not isinstance(max_retry, int) or max_retry < 0):
            raise ValueError(f"max_retry must be a non-negative integer, got {max_retry!r}")
        if timeout is not None:
            check_seconds("timeout", timeout)
        if isinstance(retry_delay, (int, float)):
            check_seconds("retry_delay", retry_delay, zero=True)
        if isinstance(expires, datetime):
            raise TypeError("a route's expires is a length of time (seconds or a timedelta) "
                            "from each enqueue; give a datetime to client.enqueue")
        expires_in = None if expires is None else expiry(expires, 0.0)
        if debounce is not None:
            debounce, debounce_max = check_debounce_times(debounce, debounce_max)
        elif debounce_max is not None:
            raise ValueError("a route's debounce_max needs its debounce")

        def add_route(handler: HandlerT) -> HandlerT:
            if pattern in self._routes:
                raise ValueError(f"a handler for {pattern!r} is already registered")
            declared = register(handler, pattern)
            route = Route(
                pattern, handler, inspect.iscoroutinefunction(handler), queue, max_retry,
                timeout, retry_delay, concurrency, rate, max_payload, priority, expires_in,
                debounce, debounce_max, fairness_key, key_concurrency, key_rate, declared)
            self._routes.add(pattern, route)
            if not is_prefix(pattern):  # what an enqueue by the handler takes its defaults from
                declared.route = route
            return handler

        return add_route

    def route(self, task_type: str) -> Route | None:
        return self._routes.match(task_type)

    def max_payload_of(self, route: Route | None) -> int:
        """The payload limit of a route's tasks: its own, else the App's."""
        return self.max_payload if route is None or route.max_payload is None \
            else route.max_payload

    @property
    def routes(self) -> list[Route]:
        return self._routes.values()

    @property
    def queues(self) -> list[str]:
        """The queues its routes and app.queue declare, and `default` (where the others'
        tasks go): what a worker serves when it is not told which queues."""
        return sorted({DEFAULT_QUEUE, *(r.queue for r in self.routes if r.queue),
                       *self.partitions})

    def periodic(self, spec: str, task_type: str, payload: Any = None, *,
                 name: str | None = None, timezone: str = "UTC", missed: str = "once",
                 **options: Any) -> Schedule:
        """Enqueue `task_type` on a cron spec ('0 3 * * *', read in `timezone`) or at an
        interval ('@every 30s') while `obsq scheduler` runs. `name` (default: the task
        type) names the entry in Redis, `obsq schedules` and the metrics; `missed` says
        which fires the schedulers were all down for are enqueued when one is back: "once"
        the latest, "skip" none. Options are those of Client.enqueue."""
        entry = Schedule(task_type if name is None else name, spec, task_type, payload,
                         timezone, missed, options, source="app")
        if entry.name in self.schedules:
            raise ValueError(f"a periodic entry named {entry.name!r} is already registered; "
                             "give each a name=")
        self.schedules[entry.name] = entry
        return entry

    def aggregate(self, pattern: str, aggregator: Aggregator, *,
                  max_size: int = AGGREGATE_MAX_SIZE, max_delay: float = AGGREGATE_MAX_DELAY,
                  grace_period: float = AGGREGATE_GRACE_PERIOD) -> Aggregation:
        """Aggregate the grouped tasks (`client.enqueue(type, p, group=...)`) of the types
        `pattern` covers (a type, a prefix ending in ':' or '.', or '*'): a group is
        aggregated once it holds `max_size` tasks, `grace_period` seconds after its newest
        task or `max_delay` after its oldest, by `aggregator(group, tasks)`, which returns
        the (task type, payload) of the one task enqueued in their stead (or an obsq.Job).
        The workers of this App run the aggregators, each batch exactly once."""
        validate_name("task type", pattern)
        if not callable(aggregator):
            raise TypeError(f"aggregator must be callable, got {aggregator!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be a positive integer, got {max_size!r}")
        for name, value in (("max_delay", max_delay), ("grace_period", grace_period)):
            check_seconds(name, value)
        if pattern in self._aggregations:
            raise ValueError(f"an aggregator for {pattern!r} is already registered")
        entry = Aggregation(pattern, aggregator, max_size, float(max_delay),
                            float(grace_period))
        self._aggregations.add(pattern, entry)
        return entry

    def aggregation(self, task_type: str) -> Aggregation | None:
        return self._aggregations.match(task_type)

    @property
    def aggregations(self) -> list[Aggregation]:
        return self._aggregations.values()

    def subscribe(self, event: str, *, name: str, queue: str | None = None,
                  max_retry: int | None = None, timeout: float | None = None,
                  retry_delay: RetryDelay = None) -> Callable[[HandlerT], HandlerT]:
        """Register a subscriber of `event`: every `client.publish(event, payload)` gives
        it its own copy, a task of type `<event>@<name>` in `queue` (with its own retries
        and dead-letter entry) that the decorated handler runs. The workers serving
        `queue` register the subscription in Redis; it covers events published after."""
        validate_name("event", event)
        validate_name("subscriber", name)
        if "@" in event or "@" in name or "." in name:
            raise ValueError(f"event {event!r} may not hold '@', subscriber {name!r} neither "
                             "'@' nor '.'")
        subscription = Subscription(event, name, validate_name("queue", queue or
                                                                DEFAULT_QUEUE))
        register = self.task(subscription.task_type, queue=subscription.queue,
                             max_retry=max_retry, timeout=timeout, retry_delay=retry_delay)

        def subscribe(handler: HandlerT) -> HandlerT:
            register(handler)
            self.subscriptions[subscription.task_type] = subscription
            return handler

        return subscribe

    def use(self, middleware: Middleware) -> Middleware:
        """Wrap every handler; usable as a decorator."""
        self.middleware.append(middleware)
        return middleware

    def use_producer(self, hook: ProducerHook) -> ProducerHook:
        """Wrap every enqueue of its Clients (`client.use` wraps one's); a decorator too."""
        self.producer_hooks.append(hook)
        return hook

    def on_refusal(self, hook: RefusalHook) -> RefusalHook:
        """Call `hook(job, error)` for each job a Client built with this App refuses before
        its producer hooks run: its checks failed (TaskTooLarge, ValueError, TypeError)."""
        self.refusal_hooks.append(hook)
        return hook

    def on_outcome(self, hook: OutcomeHook) -> OutcomeHook:
        """Call `hook(task, outcome, error)` after each attempt is settled in Redis.

        `outcome` is one of OUTCOMES, or `handed_on` for a task of a type this worker has
        no handler for (with an UnknownTaskType error; `dead` with one when it was handed
        on too long). Hooks must be quick; one that raises is logged and changes nothing."""
        self.outcome_hooks.append(hook)
        return hook

    def on_recovery(self, hook: RecoveryHook) -> RecoveryHook:
        """Call `hook(queue, reason, count)` when tasks are taken back from workers;
        reason is `expired` (lease ran out) or `worker_lost` (heartbeat stopped)."""
        self.recovery_hooks.append(hook)
        return hook

    def on_throttle(self, hook: ThrottleHook) -> ThrottleHook:
        """Call `hook(queue, task, reason)` for each start a route limit or an ordering key
        held back; `task` is the route pattern (a bounded label), reason THROTTLE_REASONS'."""
        self.throttle_hooks.append(hook)
        return hook

    def on_aggregation(self, hook: AggregationHook) -> AggregationHook:
        """Call `hook(queue, pattern, outcome)` for each run of an aggregator: `pattern`
        is its app.aggregate pattern, outcome one of AGGREGATION_OUTCOMES."""
        self.aggregation_hooks.append(hook)
        return hook

    def on_flow_end(self, hook: FlowHook) -> FlowHook:
        """Call `hook(state)` when a worker, recording a step's end, ends its flow
        (`completed` or `failed`), or is the first to record one of a flow a Client
        cancelled (`cancelled`)."""
        self.flow_hooks.append(hook)
        return hook

    def on_stuck_slots(self, hook: StuckHook) -> StuckHook:
        """Call `hook(count)` when the number of a worker's stuck slots changes (plain
        handlers past their timeout, still running and holding their slot)."""
        self.stuck_hooks.append(hook)
        return hook

    def on_recycle(self, hook: RecycleHook) -> RecycleHook:
        """Call `hook(reason)` when a process past its limits (`--max-tasks-per-child`,
        `--max-memory-per-child`) is replaced: reason `tasks` or `memory`
        (obsq.engine.recycling.RECYCLE_REASONS)."""
        self.recycle_hooks.append(hook)
        return hook

    def on_redis_error(self, hook: RedisErrorHook) -> RedisErrorHook:
        """Call `hook(operation, exc)` for every failed Redis call of a worker."""
        self.redis_error_hooks.append(hook)
        return hook

    def wrap(self, innermost: CallNext) -> CallNext:
        """Compose the middleware around `innermost`, outermost first."""
        call = innermost
        for middleware in reversed(self.middleware):
            call = _bind(middleware, call)
        return call


def _byte_limit(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_payload must be a positive number of bytes, got {value!r}")
    return value


def _bind(middleware: Middleware, call_next: CallNext) -> CallNext:
    def call(task: Task[Any]) -> Awaitable[Any]:
        return middleware(task, call_next)
    return call




def load_app(spec: str) -> App:
    """'package.module:app' -> the App object, with a clear error for each way it can fail
    (the `obsq` commands take the App this way, from the current directory too)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"expected MODULE:APP (like myproject.tasks:app), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StartupError(f"cannot import {module_name!r}: {exc}") from None
    app: Any = module
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(app, part):
            where = ".".join([module_name, *attribute.split(".")[:depth]])
            raise StartupError(f"{spec!r}: {where} has no attribute {part!r}")
        app = getattr(app, part)
    if not isinstance(app, App):
        raise StartupError(f"{spec!r} is not an obsq.App (found {type(app).__name__})")
    app.import_path = spec
    return app


CATCH_ALL = "*"
PREFIX_ENDINGS = (":", ".")
T = TypeVar("T")
_MISSING: Any = object()


def is_prefix(pattern: str) -> bool:
    return pattern == CATCH_ALL or pattern.endswith(PREFIX_ENDINGS)


class PatternTable(Generic[T]):
    """Values by route pattern, found for a task type as routes are: the exact type, else
    the longest prefix (ending in ':' or '.') it starts with, else '*'."""

    def __init__(self) -> None:
        self._exact: dict[str, T] = {}
        self._prefixes: list[tuple[str, T]] = []  # longest first, '*' last
        self._cache: dict[str, T | None] = {}

    def __contains__(self, pattern: str) -> bool:
        return pattern in self._exact or any(p == pattern for p, _ in self._prefixes)

    def add(self, pattern: str, value: T) -> None:
        if is_prefix(pattern):
            self._prefixes.append((pattern, value))
            self._prefixes.sort(key=lambda item: (item[0] == CATCH_ALL, -len(item[0])))
        else:
            self._exact[pattern] = value
        self._cache.clear()

    def match(self, task_type: str) -> T | None:
        found = self._cache.get(task_type, _MISSING)
        if found is _MISSING:
            found = self._exact.get(task_type)
            if found is None:
                found = next((v for p, v in self._prefixes
                              if p == CATCH_ALL or task_type.startswith(p)), None)
            if len(self._cache) < 10_000:  # types behind "*" are unbounded
                self._cache[task_type] = found
        return found

    def values(self) -> list[T]:
        return [*self._exact.values(), *(v for _, v in self._prefixes)]
