"""How the broker calls Redis: scripts through its runner (runner.py), alone, in one round
trip, or followed by WAIT; BLPOP and GET across a Cluster's slots; and every failure
reported to the `on_error(operation, exc)` callbacks (the metrics count them) and raised as
BrokerError, with where and why said. The checks made at start are startup.py's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from obsq.broker.connection import create_client
from obsq.broker.diagnosis import acl_advice, hint, reason, safe
from obsq.broker.keys import EventKeys, GlobalKeys, QueueKeys, ScheduleKeys
from obsq.broker.runner import Runner, first_error
from obsq.broker.scripts import load_scripts
from obsq.broker.wire import argv
from obsq.clock import REDIS_CLOCK, Clock
from obsq.errors import BrokerError, BrokerTimeout, ConfigurationError, denied_by_acl
from obsq.hooks import Hooks
from obsq.settings import (
    DEDUP_MAX_IDS,
    DEDUP_WINDOW,
    DURABLE_WAIT_TIMEOUT,
    ENQUEUE_MEMORY_SHARE,
    REDIS_CREDENTIAL_VARIABLES,
)

log = logging.getLogger("obsq")

ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # script name, keys, arguments
SCRIPTS = load_scripts()
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
OPERATIONS = tuple(sorted({*SCRIPTS, *COMMANDS}))
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)  # said as "cannot reach"


class RedisCalls:
    def __init__(self, url: str, namespace: str, *, client: Any = None,
                 clock: Clock | None = None,
                 on_error: Hooks[[str, BaseException]] | None = None,
                 memory_share: float = ENQUEUE_MEMORY_SHARE, durable_replicas: int = 0,
                 priority_aging: float = 60.0, dedup_window: float = DEDUP_WINDOW,
                 dedup_max_ids: int = DEDUP_MAX_IDS) -> None:
        """Its callers' settings are given here, never written later: `on_error`, the list
        of hooks told of each failed call (a worker gives its App's, so that hooks added
        later count); `memory_share`, above which enqueues are refused (enqueue.lua);
        `durable_replicas`, the replicas each enqueue waits for (WAIT, not on a Cluster);
        `priority_aging`, the seconds a pending task waits to rank one priority higher;
        `dedup_window` and `dedup_max_ids`, how long a deleted task's producer-chosen id
        is remembered, and how many per queue."""
        if not 0 < memory_share <= 1:
            raise ConfigurationError(f"memory_share must be above 0 and at most 1, got "
                                     f"{memory_share!r}")
        self.url = url
        self.clock = clock or REDIS_CLOCK  # the time every script is given (the runner's now)
        self.safe_url = safe(url)  # the URL without its password, for messages and logs
        self.namespace = namespace
        self.redis = client if client is not None else create_client(url)
        self.is_cluster = isinstance(self.redis, RedisCluster)
        if durable_replicas < 0 or (durable_replicas and self.is_cluster):
            raise ConfigurationError("durable_replicas must be a number of replicas, and "
                                     "is not available on a Redis Cluster")
        # every script call; enqueues go over one connection kept for them while it is free
        self.runner = Runner(self.redis, keep=True, now=self.clock.script_now)
        self.memory_share = memory_share
        self.durable_replicas = durable_replicas
        self.priority_aging = priority_aging
        self.dedup_window = dedup_window
        self.dedup_max_ids = dedup_max_ids
        self.durable_timeout = DURABLE_WAIT_TIMEOUT
        self.global_keys = GlobalKeys(namespace)
        self.schedule_keys = ScheduleKeys(namespace)
        self.event_keys = EventKeys(namespace)
        self._queue_keys: dict[str, QueueKeys] = {}
        self.on_error: Hooks[[str, BaseException]] = (
            on_error if on_error is not None else Hooks("Redis-error hook"))

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
        """A call that got no answer within its deadline (deadline.py), reported like any
        failure."""
        error = BrokerTimeout(operation, timeout, self.safe_url)
        self.on_error(operation, error)
        return error

    async def _guard(self, operation: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except (RedisError, OSError) as exc:
            raise self.failed(operation, exc) from exc

    async def _blpop_any(self, operation: str, keys: Sequence[str], timeout: float) -> Any:
        """BLPOP on keys that may live in different Cluster slots (one BLPOP each there, the
        first answer wins): (key, value), or None after `timeout`."""
        if not self.is_cluster or len(keys) == 1:
            return await self._guard(operation, self.redis.blpop(keys, timeout=timeout))
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
        return await self._guard(name, self.runner.call(SCRIPTS[name], keys, args))

    async def _producer_script(self, name: str, keys: Sequence[str], args: Sequence[Any]
                               ) -> Any:
        """A script call on the runner's kept connection when it is free, else on one from
        the pool; with `durable_replicas`, followed by WAIT (_script_replicated)."""
        if self.durable_replicas:
            return await self._script_replicated(name, keys, args)
        return await self._guard(name, self.runner.call_kept(SCRIPTS[name], keys, args))

    async def _script_replicated(self, name: str, keys: Sequence[str], args: Sequence[Any]
                                 ) -> Any:
        """The script, then WAIT on the same connection: it answers once `durable_replicas`
        replicas have the script's writes, else after `durable_timeout`, which refuses the
        call (the writes are then on the master only, and a failover may lose them)."""
        wait = ("WAIT", self.durable_replicas, max(int(self.durable_timeout * 1000), 1))
        try:
            replies = await self.runner.calls([(SCRIPTS[name], keys, args)], after=wait)
            first_error(replies)
        except (RedisError, OSError) as exc:
            raise self.failed(name, exc) from exc
        reply, replicas = replies
        if replicas < self.durable_replicas:
            raise self.failed(name, RedisError(
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
            results = await self.runner.calls([(SCRIPTS[n], k, a) for n, k, a in calls])
            first_error(results)
            return results
        except (RedisError, OSError) as exc:
            raise self.failed(calls[0][0], exc) from exc
