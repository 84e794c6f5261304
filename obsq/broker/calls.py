"""How the broker calls Redis: scripts alone, in one round trip, or followed by WAIT; BLPOP
and GET across a Cluster's slots; every failure reported to the `on_error(operation, exc)`
hooks (the metrics count them) and raised as BrokerError, with where and why said; and the
deadline of a producer's call. The checks made at start are startup.py's.

The runner (`Runner` on an asyncio client, `BlockingRunner` on a blocking one) is the one
way a script is called: by SHA, loaded again after NOSCRIPT (a restarted or failed-over
Redis has none), alone, in a pipeline, or on a connection kept beside the pool. Every
script's first argument, the time it is to read ("now", in ms; 0: Redis's own clock,
TIME), comes from the runner's `now`, and nowhere else. The low-level redis-py calls
(packed commands, raw replies, the check a pool makes before lending a connection) live in
the runner only: redis-py's major version is pinned in pyproject while they do.

Deadlines: a web app's request must not wait for ever on a Redis that was stopped (SIGSTOP,
a frozen VM) or sits behind a stuck proxy, where the kernel still accepts the bytes and TCP
keepalive sees nothing wrong; nor may a worker whose connections a NAT or load balancer
dropped silently (their replies never come) wait for ever, so a broker given a
`call_timeout` (a worker's) bounds every call it makes, a blocking wait by its wait plus
that deadline. On the event loop a call that outlives its deadline is
cancelled, wherever it waits (pool checkout, connect, a round trip): no socket timeout,
which redis-py turns into a task per command, and no timer per call either
(asyncio.timeout cost an enqueue 13 µs of its 45 µs of CPU; this costs 0.6 µs): the calls
of one Client share one length of deadline, so they fall due in the order they started,
and one timer walks them. Cancelling a redis-py call halfway closes its connection, so a
reply that arrives late is never read as the answer to the next call. The blocking client
of the SyncClient cannot be interrupted; its sockets, connects and pool waits get the
deadline as their timeout instead (connection.create_client)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar
from urllib.parse import urlsplit

import orjson
from hiredis import pack_command
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from obsq.broker.connection import create_client, kept_connection
from obsq.broker.diagnosis import acl_advice, hint, reason, safe
from obsq.broker.keys import EventKeys, GlobalKeys, QueueKeys, ScheduleKeys
from obsq.broker.scripts import Script, script_names, scripts
from obsq.broker.wire import REPLIES, argv, as_text
from obsq.clock import REDIS_CLOCK, Clock
from obsq.errors import BrokerError, BrokerTimeout, ConfigurationError, denied_by_acl
from obsq.names import is_seconds, seconds_rule
from obsq.settings import (
    CALL_TIMEOUT,
    DEDUP_MAX_IDS,
    DEDUP_WINDOW,
    DURABLE_WAIT_TIMEOUT,
    ENQUEUE_MEMORY_SHARE,
    REDIS_CREDENTIAL_VARIABLES,
)

log = logging.getLogger("obsq")

ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # script name, keys, arguments
# Every `operation` a failed call is reported under (the label of obsq_redis_errors_total):
# the scripts, and the plain commands and calls named here, so that metrics can start each
# at 0.
COMMANDS = ("dataset", "delete_namespace", "deregister", "find_queue", "flow_delete",
            "flow_info", "forget_workers",
            "lost_workers", "memory_policy", "memory_usage", "namespaces", "partition_counts",
            "publish",
            "queues", "read_cancels", "read_inbox", "schedule_entries", "set_progress",
            "still_held",
            "task_info",
            "wait_for_work", "wait_schedule_change", "workers")
OPERATIONS = tuple(sorted({*script_names(), *COMMANDS}))
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)  # said as "cannot reach"
_JUNK_REGISTRIES_SAID: set[str] = set()  # by key: once a process (junk_registry)


class RedisCalls:
    def __init__(self, url: str, namespace: str, *, client: Any = None,
                 clock: Clock | None = None,
                 on_error: Callable[[str, BaseException], None] = lambda operation, exc: None,
                 memory_share: float = ENQUEUE_MEMORY_SHARE, durable_replicas: int = 0,
                 priority_aging: float = 60.0, dedup_window: float = DEDUP_WINDOW,
                 dedup_max_ids: int = DEDUP_MAX_IDS, call_timeout: float | None = None,
                 loop_blocked: Callable[[], float] | None = None,
                 fairness_weights: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """Its callers' settings are given here, never written later: `on_error`, told of
        each failed call (a Worker gives its App's Redis-error hooks, a Client its own: a
        guarded registry, so that hooks added later count and one that raises changes
        nothing); `memory_share`, above which enqueues are refused (enqueue.lua);
        `durable_replicas`, the replicas each enqueue waits for (WAIT, not on a Cluster);
        `priority_aging`, the seconds a pending task waits to rank one priority higher;
        `dedup_window` and `dedup_max_ids`, how long a deleted task's producer-chosen id
        is remembered, and how many per queue; `call_timeout`, the deadline of each of its
        calls (a worker's, a scheduler's; None: none, as the broker a Client makes, whose
        calls the Client bounds itself),
        not counting the time the event loop stood blocked (`loop_blocked()`: that time so
        far), when the reply may have come and waited for the loop; `fairness_weights`, per
        queue the fairness keys that take more than one task per turn (App.fairness_weights)."""
        if not 0 < memory_share <= 1:
            raise ConfigurationError(f"memory_share must be above 0 and at most 1, got "
                                     f"{memory_share!r}")
        self.url = url
        self.clock = clock or REDIS_CLOCK  # the time every script is given (the runner's now)
        self.safe_url = safe(url)  # the URL without its password, for messages and logs
        self.namespace = namespace
        self.redis = client if client is not None else create_client(url)
        self.is_cluster = isinstance(self.redis, RedisCluster)
        if durable_replicas < 0:
            raise ConfigurationError(f"durable_replicas must be a number of replicas, got "
                                     f"{durable_replicas!r}")
        if durable_replicas and self.is_cluster:
            raise ConfigurationError(
                "durable_replicas is not available on a Redis Cluster: it sends WAIT behind "
                "each enqueue on the connection that wrote it, and on a Cluster each script "
                "goes alone, with nothing after it on its node. On a Cluster, set "
                "min-replicas-to-write and min-replicas-max-lag on each master to bound what "
                "a failover loses, or run one master with replicas and Sentinel, where "
                "durable_replicas loses no acknowledged enqueue")
        # every script call; enqueues go over one connection kept for them while it is free
        self.runner = Runner(self.redis, keep=True, now=self.clock.script_now)
        self.memory_share = memory_share
        self.durable_replicas = durable_replicas
        self.priority_aging = priority_aging
        self.fairness_weights = {queue: orjson.dumps(dict(weights))
                                 for queue, weights in (fairness_weights or {}).items()}
        self.dedup_window = dedup_window
        self.dedup_max_ids = dedup_max_ids
        self.durable_timeout = DURABLE_WAIT_TIMEOUT
        self.global_keys = GlobalKeys(namespace)
        self.schedule_keys = ScheduleKeys(namespace)
        self.event_keys = EventKeys(namespace)
        self._queue_keys: dict[str, QueueKeys] = {}
        self.on_error = on_error
        self.deadlines = None if call_timeout is None else Deadlines(
            loop_blocked, seconds=call_timeout, error=self.timed_out)

    def keys(self, queue: str) -> QueueKeys:
        keys = self._queue_keys.get(queue)
        if keys is None:
            keys = self._queue_keys[queue] = QueueKeys(self.namespace, queue)
        return keys

    def _contact_failure(self, exc: BaseException) -> str:
        """A failed connection, said as where and why, without redis-py's wrapping."""
        if isinstance(exc, AuthenticationError):
            if urlsplit(self.url).password is None and not os.environ.get(
                    REDIS_CREDENTIAL_VARIABLES["password"]):
                return (f"Redis at {self.safe_url} requires a password, and the URL gives "
                        "none: redis://[USER]:PASSWORD@HOST:PORT/DB, or OBSQ_REDIS_PASSWORD "
                        "(and OBSQ_REDIS_USERNAME) beside it")
            return f"Redis at {self.safe_url} refused the credentials: {exc}"
        return (f"cannot reach Redis at {self.safe_url}: {reason(exc)}"
                f"{hint(self.url, exc, self.namespace)}")

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.runner.close()
            await self.redis.aclose()

    def failed(self, operation: str, exc: BaseException, message: str | None = None
                ) -> BrokerError:
        self.on_error(operation, exc)
        if message is None and denied_by_acl(exc):
            message = (f"Redis call {operation!r} refused to the Redis user: {exc}; "
                       f"{acl_advice(self.namespace)}")
        elif message is None and isinstance(exc, UNREACHABLE):
            message = f"Redis call {operation!r} failed: {self._contact_failure(exc)}"
        return BrokerError(operation, exc, message)

    def timed_out(self, operation: str, timeout: float) -> BrokerTimeout:
        """A call that got no answer within its deadline (Deadlines), reported like any
        failure; a broker with a deadline of its own is a worker's or a scheduler's."""
        error = BrokerTimeout(operation, timeout, self.safe_url,
                              worker=self.deadlines is not None)
        self.on_error(operation, error)
        return error

    def _within(self, operation: str, call: Awaitable[T], wait: float = 0.0) -> Awaitable[T]:
        """`call` within the broker's call deadline, if it has one, and `wait` more for a
        call that blocks in Redis that long (BLPOP); past it the call is cancelled, which
        closes its connection, and BrokerTimeout is raised."""
        if self.deadlines is None:
            return call
        return self.deadlines.run(operation, call,
                                  self.deadlines.seconds + wait if wait else None)

    async def _guard(self, operation: str, call: Awaitable[Any], wait: float = 0.0) -> Any:
        """`call`, within its deadline (`_within`); a failure raised as BrokerError."""
        try:
            return await self._within(operation, call, wait)
        except (RedisError, OSError) as exc:
            raise self.failed(operation, exc) from exc

    async def _registry(self, operation: str, key: str, read: Awaitable[T], empty: T) -> T:
        """A read of one of the namespace's registries (its queues, their partition counts,
        its workers), within its deadline; a junk one (`junk_registry`) reads as `empty`."""
        try:
            return await self._within(operation, read)
        except (RedisError, OSError) as exc:
            if self.junk_registry(key, exc):
                return empty
            raise self.failed(operation, exc) from exc

    def junk_registry(self, key: str, exc: BaseException) -> bool:
        """Whether a registry's read failed for its key holding another type (written
        outside obsq), said once: it then reads as empty until the next registration
        replaces it (register.lua), so that a junk registry does not stop the namespace."""
        if not (isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")):
            return False
        if key not in _JUNK_REGISTRIES_SAID:
            _JUNK_REGISTRIES_SAID.add(key)
            log.warning("Redis key %s is not the registry obsq keeps there (%s): read as "
                        "empty until a worker or producer registers again, which replaces "
                        "it", key, exc)
        return True

    async def _blpop_any(self, operation: str, keys: Sequence[str], timeout: float) -> Any:
        """BLPOP on keys that may live in different Cluster slots (one BLPOP each there, the
        first answer wins): (key, value), or None after `timeout`."""
        if not self.is_cluster or len(keys) == 1:
            return await self._guard(operation, self.redis.blpop(keys, timeout=timeout),
                                     wait=timeout)
        waits = [asyncio.ensure_future(self._blpop_any(operation, [k], timeout)) for k in keys]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        replies = [w.result() for w in done]  # raises the first failure
        return next((r for r in replies if r is not None), None)

    async def _get_many(self, operation: str, keys: Sequence[str]) -> list[Any]:
        """GET of keys in different cluster slots, in one round trip (MGET cannot)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        return await self._guard(operation, pipe.execute())

    def register_queues_call(self, queues: Iterable[str]) -> ScriptCall:
        return ("register", (self.global_keys.queues,), argv("register", kind="set",
                                                                 members=queues))

    def declare_partitions_call(self, counts: dict[str, int]) -> ScriptCall:
        """Queues' partition counts into the namespace's hash (register.lua)."""
        return ("register", (self.global_keys.partitions,), argv(
            "register", counts.items(), kind="hash"))

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = scripts()[name]
        return await self._guard(script.operation, self.runner.call(script, keys, args))

    @staticmethod
    def said_aside(queue: str, script: str, rows: Sequence[Sequence[Any]]) -> None:
        """Say each record the script set aside in the queue's junk (set_aside): once, as
        the script took it out of the place where it was found."""
        for row in REPLIES[script].rows_of("aside", rows):
            log.warning("queue %s: set %s aside in the queue's junk: %s; the rest goes on "
                        "(`obsq doctor` lists the junk)", queue, as_text(row.name),
                        as_text(row.why or b""))

    def _producer_script(self, name: str, keys: Sequence[str], args: Sequence[Any]
                         ) -> Awaitable[Any]:
        """A script call on the runner's kept connection when it is free, else on one from
        the pool; with `durable_replicas`, followed by WAIT (_script_replicated). Not a
        coroutine of its own: an enqueue's every frame costs its CPU."""
        script = scripts()[name]
        if self.durable_replicas:
            return self._script_replicated(script, keys, args)
        return self._guard(script.operation, self.runner.call_kept(script, keys, args))

    async def _script_replicated(self, script: Script, keys: Sequence[str],
                                 args: Sequence[Any]) -> Any:
        """The script, then WAIT on the same connection: it answers once `durable_replicas`
        replicas have the script's writes, else after `durable_timeout`, which refuses the
        call (the writes are then on the master only, and a failover may lose them)."""
        wait = ("WAIT", self.durable_replicas, max(int(self.durable_timeout * 1000), 1))
        operation = script.operation
        try:
            replies = await self._within(operation, self.runner.calls(
                [(script, keys, args)], after=wait), wait=self.durable_timeout)
            first_error(replies)
        except (RedisError, OSError) as exc:
            raise self.failed(operation, exc) from exc
        reply, replicas = replies
        if replicas < self.durable_replicas:
            raise self.failed(operation, RedisError(
                f"the write reached {replicas} of the {self.durable_replicas} replica(s) "
                f"durable_replicas asks for within {self.durable_timeout:g} s; it is on the "
                "master only, where a failover may lose it"))
        return reply

    async def _scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Several script calls (name, keys, args) in one round trip."""
        if not calls:
            return []
        if len(calls) == 1:
            return [await self._script(*calls[0])]
        try:
            results = await self._within(calls[0][0], self.runner.calls(
                [(scripts()[n], k, a) for n, k, a in calls]))
            first_error(results)
            return results
        except (RedisError, OSError) as exc:
            raise self.failed(calls[0][0], exc) from exc


Call = tuple[Script, Sequence[str], Sequence[Any]]  # a script, its keys, its arguments
Command = tuple[Any, ...]  # a plain command sent beside scripts: ("WAIT", 1, 500)
Now = Callable[[], int]


def redis_clock() -> int:
    """The scripts' "now" while the caller drives no clock: 0, Redis reads TIME."""
    return 0


def is_noscript(result: Any) -> bool:
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and str(result).startswith("NOSCRIPT"))


def first_error(results: Sequence[Any]) -> None:
    """Raise the first failure among a pipeline's replies."""
    for result in results:
        if isinstance(result, Exception):
            raise result


class _Args:
    """How a call's words are laid out: shared by both runners."""

    now: Now = staticmethod(redis_clock)

    def words(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple:
        """EVALSHA's words after the command's name."""
        if script.takes_now:
            return (script.sha, len(keys), *keys, self.now(), *args)
        return (script.sha, len(keys), *keys, *args)


class Runner(_Args):
    """Scripts on a redis-py asyncio client. With `keep`, one connection is kept beside the
    pool for `call_kept` (enqueues: no pool checkout per call), where one can be (not on a
    Cluster or Sentinel, see connection.kept_connection)."""

    def __init__(self, redis: Any, *, keep: bool = False, now: Now = redis_clock) -> None:
        self.redis = redis
        self.now = now
        self.is_cluster = isinstance(redis, RedisCluster)
        self.kept = kept_connection(redis) if keep else None
        self._kept_busy = False

    async def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        words = self.words(script, keys, args)
        try:
            return await self.redis.evalsha(*words)
        except ResponseError as exc:
            if not is_noscript(exc):
                raise
        await self.load(script)
        return await self.redis.evalsha(*words)

    async def load(self, script: Script) -> None:
        """SCRIPT LOAD alone (the start-up check probes whether the user may)."""
        await self.redis.script_load(script.source)

    async def call_kept(self, script: Script, keys: Sequence[str], args: Sequence[Any]
                        ) -> Any:
        """On the kept connection while it is free, else on one from the pool (another
        queue's batch is using it). The kept connection is used by one caller at a time,
        with nothing else in flight on it; its commands are packed by hiredis at once
        (redis-py's asyncio packer encodes every argument in Python: 9 µs of an enqueue's
        150). One the server closed while it sat idle (a restart) is made again before the
        call; one that failed or was cancelled halfway is closed, as a reply may be left
        unread on it, and made again at the next call."""
        connection = self.kept
        if connection is None or self._kept_busy:
            return await self.call(script, keys, args)
        self._kept_busy = True
        try:
            try:
                # the check a pool makes before lending a connection
                stale = connection.is_connected and await connection.can_read()
            except RedisConnectionError:
                stale = True
            if stale:
                await connection.disconnect()
            packed = [pack_command(("EVALSHA", *self.words(script, keys, args)))]
            for attempt in range(2):
                try:
                    await connection.send_packed_command(packed, check_health=False)
                    return await connection.read_response()
                except ResponseError as exc:
                    if attempt or not is_noscript(exc):
                        raise
                    await connection.send_command("SCRIPT", "LOAD", script.source)
                    await connection.read_response()
        except ResponseError:
            raise
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            self._kept_busy = False

    async def calls(self, calls: Sequence[Call], *, before: Command | None = None,
                    after: Command | None = None) -> list[Any]:
        """Scripts in one round trip, between optional plain commands -> every reply in
        order, a failure in its place (not raised). Scripts Redis had not got are loaded
        and sent again, with `after` behind them (a WAIT must follow the writes);
        `before` (a BLPOP that already returned) is not sent again. On a Cluster, whose
        pipelines refuse EVALSHA, the scripts go at once, each alone, and no command."""
        if self.is_cluster:
            if before or after:
                raise ValueError("a Cluster takes no command beside its scripts")
            return list(await asyncio.gather(*(self.call(*c) for c in calls),
                                             return_exceptions=True))
        lead = [before] if before else []
        results = await self._pipeline(lead, calls, after)
        missing = [i for i, r in enumerate(results[len(lead):len(lead) + len(calls)])
                   if is_noscript(r)]
        if missing:
            for script in {calls[i][0] for i in missing}:
                await self.load(script)
            again = await self._pipeline([], [calls[i] for i in missing], after)
            for i, result in zip(missing, again):
                results[len(lead) + i] = result
            if after:
                results[-1] = again[-1]
        return results

    async def _pipeline(self, lead: list[Command], calls: Sequence[Call],
                        after: Command | None) -> list[Any]:
        """The commands in one write on a connection of the pool, packed by hiredis (a
        worker's fetch carries eight words per completion: redis-py's packer, in Python,
        took a sixth of a busy worker's time), and their replies, a failure in its place."""
        commands = [*lead, *(("EVALSHA", *self.words(*call)) for call in calls),
                    *([after] if after else [])]
        pool = self.redis.connection_pool
        connection = await pool.get_connection()
        try:
            await connection.send_packed_command([pack_command(c) for c in commands])
            replies: list[Any] = []
            for _ in commands:  # redis-py drops a connection a failed read leaves
                try:
                    replies.append(await connection.read_response())
                except ResponseError as exc:
                    replies.append(exc)
            return replies
        finally:
            await pool.release(connection)

    async def close(self) -> None:
        if self.kept is not None:
            await self.kept.disconnect()


class BlockingRunner(_Args):
    """Scripts on a blocking redis-py client, from any thread: the client is made by
    `make_client` at the first call (a Cluster client connects when it is made). With
    `keep`, one connection is kept beside the pool for whichever thread finds it free
    (made again in a forked child)."""

    def __init__(self, make_client: Callable[[], Any], *, keep: bool = False,
                 now: Now = redis_clock) -> None:
        self._make_client = make_client
        self._redis: Any = None
        self._made = threading.Lock()
        self.now = now
        self._keep = keep
        self._kept: Any = None
        self._kept_pid = 0  # the process it was made in
        self._kept_free = threading.Lock()

    @property
    def redis(self) -> Any:
        if self._redis is None:
            with self._made:
                if self._redis is None:
                    self._redis = self._make_client()
        return self._redis

    def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        words = self.words(script, keys, args)
        if self._keep and self._kept_free.acquire(blocking=False):
            try:
                kept = self._kept_connection()
                if kept is not None:
                    return _on_blocking_connection(kept, script, words)
            finally:
                self._kept_free.release()
        try:
            return self.redis.evalsha(*words)
        except ResponseError as exc:
            if not is_noscript(exc):
                raise
        self.redis.script_load(script.source)
        return self.redis.evalsha(*words)

    def calls(self, calls: Sequence[Call]) -> list[Any]:
        """Several scripts, one after the other (the first failure is raised)."""
        return [self.call(*c) for c in calls]

    def _kept_connection(self) -> Any:
        """The kept connection (None on a Cluster or Sentinel); the caller holds the lock."""
        if self._kept_pid != os.getpid():
            self._kept = kept_connection(self.redis)
            self._kept_pid = os.getpid()
        return self._kept

    def close(self) -> None:
        with self._kept_free:
            if self._kept is not None and self._kept_pid == os.getpid():
                self._kept.disconnect()
        if self._redis is not None:
            self._redis.close()


def _on_blocking_connection(connection: Any, script: Script, words: tuple) -> Any:
    """`script` on a kept redis-py blocking connection, used as Runner.call_kept uses its
    asyncio one."""
    try:
        try:
            stale = connection.can_read()  # connects one that is not
        except RedisConnectionError:
            stale = True
        if stale:
            connection.disconnect()
        packed = [pack_command(("EVALSHA", *words))]
        for attempt in range(2):
            try:
                connection.send_packed_command(packed, check_health=False)
                return connection.read_response()
            except ResponseError as exc:
                if attempt or not is_noscript(exc):
                    raise
                connection.send_command("SCRIPT", "LOAD", script.source)
                connection.read_response()
    except ResponseError:
        raise
    except BaseException:
        connection.disconnect()
        raise


T = TypeVar("T")
P = ParamSpec("P")
TimedOut = Callable[[str, float], BaseException]  # (operation, seconds) -> the error raised


def uncancel(task: asyncio.Task[Any]) -> int:
    """Take back a cancellation of `task` that its own code caught; the ones left."""
    taken = getattr(task, "uncancel", None)
    return taken() if taken is not None else 0


class Deadlines:
    """The deadlines of calls awaited on one event loop (`run`): the Redis calls of a
    producer or of a worker's broker (`seconds` and `error` given here) and the attempts of
    async handlers and process-pool children (their timeouts, given with each), not
    counting the time the loop stood blocked meanwhile (`blocked()`: that time so far, the
    worker's LoopMonitor).

    Calls of one length fall due in the order they started, so one timer per length, armed
    for the first of them, watches them all; when it fires it cancels those past due and is
    armed again for the next. A timer armed and cancelled per call cost each 3 µs of CPU, and
    asyncio.timeout 13 µs of an enqueue's 45. The call runs in the caller's own task (not
    wait_for's task of its own, which starts it a loop iteration late and hides it from
    current_task()); its own timeout is told apart from a cancellation from outside by the
    task's count of cancellations (`cancelling`, `uncancel`; on 3.10 an outside cancel that
    comes with the timeout merges into it). Cancelling a redis-py call halfway closes its
    connection, so a late reply is never read as the answer to the next call."""

    def __init__(self, blocked: Callable[[], float] | None = None, *, seconds: float = 0.0,
                 error: TimedOut | None = None, user_calls: bool = False) -> None:
        """`user_calls`: the calls run are the user's (a Client's): a BrokerError of a step
        within one (reading partition counts within an enqueue) is named by the call."""
        self._blocked = blocked
        self.seconds = seconds  # of a call given no length of its own
        self.error = error  # makes the error of a call given no error of its own
        self.user_calls = user_calls
        # by length, in start order: call key -> (its task, start, blocked time then,
        # cancellations asked of it before)
        self._running: dict[float, dict[int, tuple[asyncio.Task[Any], float, float, int]]] = {}
        self._expired: set[int] = set()  # keys of the calls their timer cancelled
        self._timers: dict[float, asyncio.TimerHandle] = {}  # by length
        self._keys = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None  # where the timers are armed
        self._clock: Callable[[], float] = time.monotonic  # the loop's time()

    async def run(self, name: str, call: Awaitable[T], seconds: float | None = None,
                  error: TimedOut | None = None) -> T:
        """`await call`, or `error(name, seconds)` once `seconds` have passed (the call is
        then cancelled); `name`: what the error names (a Redis operation, a task type)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or used again on another loop
            self._loop, self._running, self._timers = loop, {}, {}
            # asyncio's own clock read without its method's frame (a call per enqueue)
            self._clock = (time.monotonic if type(loop).time is asyncio.BaseEventLoop.time
                           else loop.time)
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline needs a task to cancel")
        if seconds is None:
            seconds = self.seconds
        key, start = next(self._keys), self._clock()
        running = self._running.get(seconds)
        if running is None:
            running = self._running[seconds] = {}
        # the cancellations asked of the task and not taken back, where tasks count them
        # (3.11+, or on 3.10 a task factory's tasks that backport it, as pytest-asyncio's);
        # else 0: a cancellation caught is simply over (looked up here, not in a helper:
        # a call per enqueue)
        counted = getattr(task, "cancelling", None)
        running[key] = (task, start, self._blocked() if self._blocked else 0.0,
                        counted() if counted is not None else 0)
        if seconds not in self._timers:
            self._timers[seconds] = loop.call_at(start + seconds, self._due, loop, seconds)
        try:
            return await call
        except asyncio.CancelledError:
            if key in self._expired and uncancel(task) <= running.get(key, _NONE)[3]:
                raise (error or self.error)(name, seconds) from None  # type: ignore[misc]
            raise  # cancelled from outside (too)
        except BrokerError as exc:
            if self.user_calls:
                raise exc.during(name) from exc.__cause__
            raise
        finally:
            running.pop(key, None)
            if self._expired:
                self._expired.discard(key)

    def _due(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        if loop is not self._loop:
            return  # armed on a loop no longer used
        running = self._running[seconds]
        now, blocked = loop.time(), self._blocked() if self._blocked else 0.0
        for key, (task, start, before, _) in running.items():
            if key in self._expired:
                continue
            due = start + seconds + blocked - before
            if due > now:
                self._timers[seconds] = loop.call_at(due, self._due, loop, seconds)
                return
            self._expired.add(key)
            task.cancel()
        del self._timers[seconds]  # none left to watch: armed again by the next call


_NONE: tuple[Any, float, float, int] = (None, 0.0, 0.0, 0)


class Producer(Protocol):
    """What a method under `deadline` belongs to: a Client."""

    deadlines: Deadlines


Method = Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]


def deadline(operation: str) -> Callable[[Method[P, T]], Method[P, T]]:
    """The decorated producer method ends within its object's deadlines, else raises their
    error (BrokerTimeout, reported to the broker's error hooks under `operation`)."""
    def bound(method: Method[P, T]) -> Method[P, T]:
        @functools.wraps(method)
        def bounded(self: Producer, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
            # the coroutine of run() itself: no frame of its own in every call
            return self.deadlines.run(operation, method(self, *args, **kwargs))
        return bounded
    return bound


def call_timeout_of(value: float | None) -> float:
    """A Client's call deadline: `value`, else OBSQ_CALL_TIMEOUT, else CALL_TIMEOUT; a
    number of seconds obsq can keep (obsq/names.py)."""
    if value is None:
        raw = os.environ.get("OBSQ_CALL_TIMEOUT", "").strip()
        try:
            value = float(raw) if raw else CALL_TIMEOUT
        except ValueError:
            raise ConfigurationError(f"OBSQ_CALL_TIMEOUT={raw!r} is not a number of "
                                     "seconds") from None
    if not is_seconds(value):
        raise ConfigurationError(f"call_timeout must be {seconds_rule()}, got {value!r}")
    return float(value)
