"""The checks a broker makes at start: one clear error for a wrong URL, password, Redis
version or ACL rule, and Redis's maxmemory-policy (an evicting Redis loses tasks)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from obsq.broker.acl import PROBE, probed_commands
from obsq.broker.calls import UNREACHABLE, RedisCalls
from obsq.broker.diagnosis import acl_advice
from obsq.broker.scripts import Script
from obsq.errors import StartupError, denied_by_acl
from obsq.settings import SAFE_MEMORY_POLICY

log = logging.getLogger("obsq")

MIN_REDIS_VERSION = (6, 2)
ACL_PROBE_VERSION = (7, 0)  # scripts flagged no-writes, which the ACL probe needs
ACL_PROBE = Script("acl_probe", PROBE, takes_now=False)


class StartupChecks(RedisCalls):
    _config_denied = False  # CONFIG GET refused once: read INFO from then on
    _policy_checked = False  # maxmemory-policy was read at start: _start_policy
    _start_policy: str | None = None

    async def check(self) -> str:
        """Fail at start with one clear error for a wrong URL, password or Redis version; a
        Redis that does not answer within the broker's call deadline (a connection a network
        drops silently) is one that may answer later."""
        if self.deadlines is None:
            return await self._check()
        return await self.deadlines.run("check", self._check(), error=self._no_answer)

    def _no_answer(self, operation: str, seconds: float) -> StartupError:
        return StartupError(f"cannot reach Redis at {self.safe_url}: no answer within "
                            f"{seconds:g} s", unreachable=True)

    async def _check(self) -> str:
        try:
            version = await self._version()
        except (RedisError, RedisClusterException, OSError) as exc:  # the last: no node
            raise StartupError(self._contact_failure(exc),
                               unreachable=_may_answer_later(exc)) from None
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
                    return worst_policy(await self._within(
                        "memory_policy", self.redis.config_get("maxmemory-policy")),
                        "maxmemory-policy")
                except ResponseError:
                    self._config_denied = True
            return worst_policy(await self._within(
                "memory_policy", self.redis.info("memory")), "maxmemory_policy")
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


def _may_answer_later(exc: BaseException) -> bool:
    """Redis did not answer at all (refused, reset, timed out, its name not resolved yet): a
    later try may reach it. Credentials and TLS (a certificate refused either way) are the
    configuration's matter, said at once."""
    if isinstance(exc, AuthenticationError) or not isinstance(
            exc, (*UNREACHABLE, RedisClusterException)):
        return False
    seen: BaseException | None = exc
    while seen is not None:  # redis-py wraps the ssl module's error in its own
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen) or "certificate" in str(seen):
            return False
        seen = seen.__cause__ or seen.__context__
    return True
