"""Running one attempt: build the Task from what Redis handed over, call the handler
through the middleware with its timeout (async handlers on the event loop, plain ones in the
worker's pool of threads or processes, obsq/engine/pools, so they cannot starve the loop), and
decide what the attempt's end means: success, retry or dead."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from obsq.app import App
from obsq.broker import FetchedTask
from obsq.broker.calls import Deadlines
from obsq.engine.pools import make_pool
from obsq.engine.pools.base import UnsentResult, handler_traceback, raised_at, timed_out
from obsq.engine.recycling import NO_RECYCLING, Recycling
from obsq.errors import PayloadError, Retry, SkipRetry, UnknownTaskType, UnreadableRecord
from obsq.flow import FLOW_HEADER
from obsq.names import queue_of
from obsq.settings import BACKOFF_BASE, BACKOFF_CAP, DEFAULT_MAX_RETRY, DEFAULT_TIMEOUT
from obsq.task import AttemptState, Task, encode_json

log = logging.getLogger("obsq")
MAX_ERROR_LENGTH = 2000
MAX_TRACEBACK_LENGTH = 8000
NO_RESULT = b"null"
# a flow's step carries this header (JSON): known without decoding the headers of every task
FLOW_HEADER_KEY = f'"{FLOW_HEADER}"'.encode()


@dataclass(slots=True)
class Verdict:
    """How an attempt ended, before Redis has recorded it."""

    outcome: str  # success | retry | dead | cancelled | handed_on | expired
    result: bytes = NO_RESULT
    error: BaseException | None = None
    delay: float = 0.0

    @property
    def error_text(self) -> str:
        if self.error is None:
            return ""
        text = f"{type(self.error).__name__}: {self.error}"
        return text if len(text) <= MAX_ERROR_LENGTH else text[:MAX_ERROR_LENGTH] + "..."

    @property
    def raised_at(self) -> str:
        return raised_at(self.error) if self.error is not None else ""

    @property
    def traceback_text(self) -> str:
        """Kept with the task for the Inspector; the end of a long one is what matters."""
        if self.error is None:
            return ""
        text = handler_traceback(self.error)
        return text if len(text) <= MAX_TRACEBACK_LENGTH else "..." + text[-MAX_TRACEBACK_LENGTH:]


def default_backoff(retry_count: int) -> float:
    """Exponential backoff with jitter: 1-2 s, 2-4 s, 4-8 s ... up to 5-10 minutes."""
    return min(BACKOFF_BASE * 2.0 ** retry_count, BACKOFF_CAP) * random.uniform(0.5, 1.0)


SUCCEEDED = Verdict("success")  # the common verdict, shared (verdicts are not changed)


def stored_options(raw: bytes) -> dict[str, Any]:
    """The options kept in a task's hash (JSON: max_retry, timeout, retention). A blob that
    is not a JSON object reads as none, and a max_retry or timeout of the wrong kind as
    absent: the route's defaults stand in. A retention that is not a number of seconds
    raises UnreadableRecord naming it: a guess would drop a result the producer asked to
    keep, or keep one it did not."""
    try:
        opts = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(opts, dict):
        return {}
    retention = opts.get("retention")
    if retention is not None:
        try:
            opts["retention"] = float(retention)
        except (TypeError, ValueError):
            raise UnreadableRecord(f"stored option 'retention' is {retention!r}, not a "
                                   "number of seconds") from None
    return opts


class Executor:
    def __init__(self, app: App, concurrency: int,
                 update_state: Callable[[Task, Any], Coroutine[Any, Any, None]], *,
                 pool: str = "thread", on_stuck: Callable[[], None] = lambda: None,
                 loop_blocked: Callable[[], float] = lambda: 0.0,
                 recycling: Recycling = NO_RECYCLING) -> None:
        """`loop_blocked()`: seconds the event loop has stood blocked (LoopMonitor), which
        the timeouts of async handlers do not count; `recycling`: the limits of a process
        pool's children."""
        self.app = app
        self.deadlines = Deadlines(loop_blocked)  # the timeouts of async handlers
        self.pool = make_pool(pool, concurrency, app, on_stuck, recycling)
        self.update_state = update_state
        self.chain = app.wrap(self._invoke)
        self._warned_results: set[str] = set()  # types whose result could not be encoded

    def build_task(self, queue: str, raw: FetchedTask, redis_now_ms: int,
                   asked_at: float) -> Task:
        """`queue`: where it was fetched, a queue or one of its partitions; `asked_at`: when
        its fetch was asked (monotonic). A task whose stored options cannot be read is
        built without them, and ends dead unrun (`AttemptState.unreadable`)."""
        route = self.app.route(raw.type)
        kept_in, queue = queue, queue_of(queue)
        unreadable = None
        try:
            opts = stored_options(raw.options)
        except UnreadableRecord as exc:
            opts, unreadable = {}, exc
        max_retry = opts.get("max_retry")
        timeout = opts.get("timeout")
        return Task(
            id=raw.id, type=raw.type, queue=queue, raw_payload=raw.payload,
            partition=kept_in if kept_in != queue else "",
            raw_headers=raw.headers, retry_count=raw.retried,
            route=route.pattern if route else "other", ordering_key=raw.ordering_key,
            binary=raw.binary, priority=raw.priority,
            attempt=AttemptState(fence=raw.fence, slot=raw.slot, id_chosen=raw.id_chosen,
                                 suspect=raw.suspect, asked_at=asked_at,
                                 flow_step=FLOW_HEADER_KEY in raw.headers,
                                 unreadable=unreadable),
            max_retry=max_retry if isinstance(max_retry, int) else
            (route.max_retry if route and route.max_retry is not None else DEFAULT_MAX_RETRY),
            timeout=timeout if isinstance(timeout, (int, float)) and timeout > 0 else
            (route.timeout if route and route.timeout else DEFAULT_TIMEOUT),
            retention=opts.get("retention") or 0.0,
            wait_seconds=max(redis_now_ms - raw.due_ms, 0) / 1000 if raw.due_ms else 0.0,
            update_state=self.update_state,
            payload_type=route.payload_type if route is not None else None)

    async def run(self, task: Task) -> Verdict:
        """Run the attempt; every exception becomes a verdict, cancellation propagates. A
        task of a type with no route never enters the chain: it is handed on to a worker
        that knows the type (a newer version, in a rolling deploy), no retry spent; one
        that could not be built ends dead unrun."""
        if task._attempt.unreadable is not None:
            return Verdict("dead", error=task._attempt.unreadable)
        if self.app.route(task.type) is None:
            return Verdict("handed_on", error=UnknownTaskType(
                f"no handler is registered for task type {task.type!r}"))
        try:
            result = await self.chain(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self.failure(task, exc)
        if result is None:  # most handlers: nothing to encode
            return SUCCEEDED
        if isinstance(result, UnsentResult):
            return self._unencodable_result(task, result.reason)
        try:
            return Verdict("success", encode_json(
                result, f"the result of task type {task.type!r}"))
        except (TypeError, ValueError) as exc:
            return self._unencodable_result(task, str(exc))

    def _unencodable_result(self, task: Task, problem: str) -> Verdict:
        """The handler ran to its end, so it is never run again for its result: without
        retention the result is dropped (a warning once per type); a task asked to keep
        its result ends dead with the reason, as what was asked cannot be kept."""
        if task.retention:
            return Verdict("dead", error=SkipRetry(f"{problem}; the handler ran and is not "
                                                   "run again"))
        if task.type not in self._warned_results:
            self._warned_results.add(task.type)
            log.warning("%s; it is not kept (return JSON, or nothing)", problem)
        return Verdict("success")

    def failure(self, task: Task, exc: BaseException) -> Verdict:
        if isinstance(exc, (SkipRetry, PayloadError)) or task.retry_count >= task.max_retry:
            return Verdict("dead", error=exc)
        delay = exc.delay if isinstance(exc, Retry) else self._retry_delay(task, exc)
        return Verdict("retry", error=exc, delay=delay)

    def _retry_delay(self, task: Task, exc: BaseException) -> float:
        route = self.app.route(task.type)
        policy = route.retry_delay if route else None
        if policy is None:
            return default_backoff(task.retry_count)
        if not callable(policy):
            return float(policy)
        try:
            return max(float(policy(task.retry_count, exc, task)), 0.0)
        except Exception:
            log.exception("retry_delay of %s failed; using the default backoff", task.type)
            return default_backoff(task.retry_count)

    def _invoke(self, task: Task) -> Awaitable[Any]:
        """The innermost layer of the middleware chain: the handler itself, as an awaitable
        (no coroutine of its own: a failure before the handler raises from the call, inside
        the caller's `await`)."""
        route = self.app.route(task.type)
        if route is None:  # a middleware changed task.type
            raise UnknownTaskType(f"no handler is registered for task type {task.type!r}")
        # decode now: a tampered payload, or one that no longer decodes into the handler's
        # payload type, must fail before the handler (PayloadError: dead, no retries)
        task.payload  # noqa: B018
        if route.is_async:
            return self.deadlines.run(task.type, route.handler(task), task.timeout,
                                      timed_out)
        return self.pool.run(route, task)  # its timeout counts from the handler's start

    def close(self) -> None:
        self.pool.close()
