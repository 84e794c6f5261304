"""How the broker calls Redis: scripts through its runner (runner.py), pipelines of them in
one round trip, and every failure reported to the `on_error(operation, exc)` callbacks
(the metrics count them) and raised as BrokerError."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from obsq.broker.acl import PROBE, probed_commands
from obsq.broker.connection import create_client
from obsq.broker.diagnosis import acl_advice, hint, reason, safe
from obsq.broker.keys import EventKeys, GlobalKeys, QueueKeys, ScheduleKeys
from obsq.broker.runner import Runner, first_error
from obsq.broker.scripts import Script, load_scripts
from obsq.broker.wire import argv
from obsq.clock import REDIS_CLOCK, Clock
from obsq.errors import BrokerError, BrokerTimeout, StartupError, denied_by_acl
from obsq.settings import (
    DEDUP_MAX_IDS,
    DEDUP_WINDOW,
    DURABLE_WAIT_TIMEOUT,
    ENQUEUE_MEMORY_SHARE,
    REDIS_CREDENTIAL_VARIABLES,
    SAFE_MEMORY_POLICY,
)

log = logging.getLogger("obsq")

ErrorHook = Callable[[str, BaseException], None]
ScriptCall = tuple[str, Sequence[str], Sequence[Any]]  # script name, keys, arguments
MIN_REDIS_VERSION = (6, 2)
ACL_PROBE_VERSION = (7, 0)  # scripts flagged no-writes, which the ACL probe needs
ACL_PROBE = Script("acl_probe", PROBE, takes_now=False)
SCRIPTS = load_scripts()
# Every `operation` a failed call is reported under (the label of obsq_redis_errors_total):
# the scripts, and the plain commands and calls named here, so that metrics can start each
# at 0.
COMMANDS = ("dataset", "delete_namespace", "deregister", "find_queue", "flow_delete",
            "flow_info", "forget_workers",
            "lost_workers", "memory_policy", "memory_usage", "namespaces", "publish",
            "queues", "read_cancels", "read_inbox", "schedule_entries", "set_progress",
            "still_held",
            "task_info",
            "wait_for_work", "wait_schedule_change", "workers")
OPERATIONS = tuple(sorted({*SCRIPTS, *COMMANDS}))
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)  # said as "cannot reach"


class RedisCalls:
    def __init__(self, url: str, namespace: str, *, client: Any = None,
                 clock: Clock | None = None) -> None:
        self.url = url
        self.clock = clock or REDIS_CLOCK  # the time every script is given (the runner's now)
        self.safe_url = safe(url)  # the URL without its password, for messages and logs
        self.namespace = namespace
        self.redis = client if client is not None else create_client(url)
        self.is_cluster = isinstance(self.redis, RedisCluster)
        # every script call; enqueues go over one connection kept for them while it is free
        self.runner = Runner(self.redis, keep=True, now=self.clock.script_now)
        self.memory_share = ENQUEUE_MEMORY_SHARE  # enqueues refused above it (enqueue.lua)
        self.durable_replicas = 0  # replicas each enqueue waits for (WAIT)
        # how long a deleted task's producer-chosen id is remembered, and how many per queue
        self.dedup_window = DEDUP_WINDOW
        self.dedup_max_ids = DEDUP_MAX_IDS
        self.durable_timeout = DURABLE_WAIT_TIMEOUT
        self.global_keys = GlobalKeys(namespace)
        self.schedule_keys = ScheduleKeys(namespace)
        self.event_keys = EventKeys(namespace)
        self._queue_keys: dict[str, QueueKeys] = {}
        self.on_error: list[ErrorHook] = []
        self._config_denied = False  # CONFIG GET refused once: read INFO from then on
        self._policy_checked = False  # maxmemory-policy was read at start: _start_policy
        self._start_policy: str | None = None

    def keys(self, queue: str) -> QueueKeys:
        keys = self._queue_keys.get(queue)
        if keys is None:
            keys = self._queue_keys[queue] = QueueKeys(self.namespace, queue)
        return keys

    async def check(self) -> str:
        """Fail at start with one clear error for a wrong URL, password or Redis version."""
        try:
            version = await self._version()
        except (RedisError, RedisClusterException, OSError) as exc:  # the last: no node
            raise StartupError(self._contact_failure(exc)) from None
        release = tuple(int(p) for p in version.split(".")[:2])
        if release < MIN_REDIS_VERSION:
            raise StartupError(f"obsq needs Redis 6.2 or newer; {self.safe_url} runs {version}")
        if release >= ACL_PROBE_VERSION:
            await self._check_acl()
        return version

    async def _version(self) -> str:
        """From INFO server, else (a user denied INFO) from HELLO, which every user may run."""
        try:
            info = await self.redis.info("server")
        except ResponseError as exc:
            if not denied_by_acl(exc):
                raise
            node = {"target_nodes": self.redis.get_default_node()} if self.is_cluster else {}
            return str(_field(await self.redis.execute_command("HELLO", **node), "version"))
        if "redis_version" not in info:  # a cluster answers per node
            info = next(iter(info.values()))
        return str(info["redis_version"])

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

    async def _check_acl(self) -> None:
        """Stop with one line when the Redis user may not run what obsq needs (acl.py)."""
        key = f"{self.namespace}:{{acl-probe}}"
        try:
            denied = [name for name, call in self._outside_probes(key).items()
                      if await _refused(call())]
            if "script|load" not in denied:  # else the probe may not be there to run
                denied += await self.runner.call(ACL_PROBE, [key], probed_commands())
        except ResponseError as exc:
            if not denied_by_acl(exc):
                return  # not a matter of permissions: the real calls will tell
            denied = [f"scripts on the keys of namespace {self.namespace} ({exc})"]
        except (RedisError, OSError) as exc:
            raise StartupError(self._contact_failure(exc)) from None
        if denied:
            names = ", ".join(d.decode() if isinstance(d, bytes) else d for d in denied)
            raise StartupError(f"the Redis user of {self.safe_url} may not run {names}: "
                               f"{acl_advice(self.namespace)}")

    def _outside_probes(self, key: str) -> dict[str, Callable[[], Awaitable[Any]]]:
        """acl.OUTSIDE_SCRIPTS, as the start-up check sends them, doing nothing: SCRIPT LOAD
        of the probe, BLPOP of a key never written for a millisecond, WAIT for no replica
        (not on a Cluster, where nothing waits for replicas)."""
        probes = {"script|load": lambda: self.runner.load(ACL_PROBE),
                  "blpop": lambda: self.redis.blpop([key], timeout=0.001),
                  "wait": lambda: self.redis.wait(0, 0)}
        if self.is_cluster:
            del probes["wait"]
        return probes

    async def memory_policy(self) -> str | None:
        """Redis's maxmemory-policy (the worst of a Cluster's nodes): CONFIG GET, else the
        `maxmemory_policy` field of INFO memory (CONFIG is often denied: managed Redis, ACL
        users); None when neither answers."""
        try:
            if not self._config_denied:
                try:
                    return worst_policy(await self.redis.config_get("maxmemory-policy"),
                                         "maxmemory-policy")
                except ResponseError:
                    self._config_denied = True
            return worst_policy(await self.redis.info("memory"), "maxmemory_policy")
        except ResponseError:
            return None
        except (RedisError, OSError) as exc:  # the first call of a Client: say where
            raise self.failed("memory_policy", exc, None if self._policy_checked
                               else self._contact_failure(exc)) from exc

    async def check_memory_policy(self, *, refuse: bool, allowed_by: str = (
            "--allow-eviction (OBSQ_ALLOW_EVICTION=true)")) -> str | None:
        """At start: a Redis that may evict task data is refused with one ConfigurationError
        (`refuse`: workers and clients not told to allow it) or warned about (the tools
        that only look). Redis is asked once per broker; returns the policy (None:
        unreadable, which is warned about once); `allowed_by`: the refusal's advice."""
        if not self._policy_checked:
            self._start_policy = await self.memory_policy()
            self._policy_checked = True
            if self._start_policy is None:
                log.warning("cannot read Redis's maxmemory-policy at %s (CONFIG GET and INFO "
                            "denied); make sure it is %s, or tasks may be evicted",
                            self.safe_url, SAFE_MEMORY_POLICY)
            elif self._start_policy != SAFE_MEMORY_POLICY and not refuse:
                log.warning("%s; set it to %s", eviction_problem(self.safe_url,
                                                                  self._start_policy),
                            SAFE_MEMORY_POLICY)
        policy = self._start_policy
        if refuse and policy is not None and policy != SAFE_MEMORY_POLICY:
            raise StartupError(
                f"{eviction_problem(self.safe_url, policy)}; set it to {SAFE_MEMORY_POLICY}, "
                f"or accept losing tasks with {allowed_by}")
        return policy

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.runner.close()
            await self.redis.aclose()

    def failed(self, operation: str, exc: BaseException, message: str | None = None
                ) -> BrokerError:
        for hook in self.on_error:
            hook(operation, exc)
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
        for hook in self.on_error:
            hook(operation, error)
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

    async def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self.runner.call(SCRIPTS[name], keys, args)
        except (RedisError, OSError) as exc:
            raise self.failed(name, exc) from exc

    async def _producer_script(self, name: str, keys: Sequence[str], args: Sequence[Any]
                               ) -> Any:
        """A script call on the runner's kept connection when it is free, else on one from
        the pool; with `durable_replicas`, followed by WAIT (_script_replicated)."""
        if self.durable_replicas:
            return await self._script_replicated(name, keys, args)
        try:
            return await self.runner.call_kept(SCRIPTS[name], keys, args)
        except (RedisError, OSError) as exc:
            raise self.failed(name, exc) from exc

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


def eviction_problem(where: str, policy: str) -> str:
    return (f"Redis at {where} has maxmemory-policy {policy}: under memory pressure it "
            "deletes task data, and tasks are lost")


def worst_policy(reply: Any, field: str) -> str | None:
    """The policy in a CONFIG GET or INFO reply; a Cluster answers per node (a dict of
    replies): any node's other than noeviction wins."""
    if not isinstance(reply, dict):
        return None
    for key, value in reply.items():
        if (key.decode() if isinstance(key, bytes) else key) == field:
            return value.decode() if isinstance(value, bytes) else str(value)
    policies = [worst_policy(node, field) for node in reply.values()]
    known = sorted({p for p in policies if p is not None}, key=lambda p: p == SAFE_MEMORY_POLICY)
    return known[0] if known else None


async def _refused(call: Awaitable[Any]) -> bool:
    """Whether Redis refuses the call to the user's ACL."""
    try:
        await call
    except ResponseError as exc:
        return denied_by_acl(exc)
    return False


def _field(reply: Any, name: str) -> Any:
    """A field of HELLO's reply: a map, or a flat list of names and values (RESP2)."""
    if not isinstance(reply, dict):
        reply = dict(zip(reply[::2], reply[1::2]))
    value = reply.get(name, reply.get(name.encode()))
    return value.decode() if isinstance(value, bytes) else value
