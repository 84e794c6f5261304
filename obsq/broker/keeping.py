"""The calls that keep a worker's claims alive, made from its heartbeat thread on a
blocking client of its own: so that a handler blocking the event loop (a sync library call
in an `async def`) cannot silence the heartbeat or let the leases lapse, and the worker's
tasks are not taken for lost and run twice while it still runs them.

The scripts and their arguments are the asyncio broker's (heartbeat.lua, register.lua,
extend.lua, subscribe.lua), built by its `*_call(s)` methods, so both sides write alike."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from obsq.broker.blocking import BlockingCalls
from obsq.broker.records import Attempt
from obsq.broker.startup import worst_policy

if TYPE_CHECKING:
    from obsq.broker.broker import Broker


class BlockingKeeping(BlockingCalls):
    """Heartbeat, leases, subscriptions, the memory policy and the data-set token, blocking
    (one thread at a time)."""

    broker: Broker  # a whole one: the heartbeat's, leases' and subscriptions' calls are its
    _config_denied = False  # CONFIG GET refused once: read INFO from then on

    def heartbeat(self, worker_id: str, description: dict[str, Any], ttl: float) -> None:
        self._scripts(self.broker.heartbeat_calls(worker_id, description, ttl))

    def extend(self, attempts: dict[str, list[Attempt]], lease_seconds: float,
               worker_id: str) -> dict[str, list[str]]:
        """Extend leases: {queue: attempts} -> {queue: ids whose lease was lost}."""
        calls, queues = self.broker.extend_calls(attempts, lease_seconds, worker_id)
        lost: dict[str, list[str]] = {queue: [] for queue in attempts}
        for queue, reply in zip(queues, self._scripts(calls)):
            lost[queue] += (i.decode() for i in reply)
        return lost

    def subscribe(self, subscriptions: Sequence[tuple[str, str, str]], ttl: float) -> None:
        if subscriptions:
            self._scripts([self.broker.subscribe_call(subscriptions, ttl)])

    def deregister(self, worker_id: str) -> None:
        g = self.broker.global_keys

        def remove() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrem(g.workers, worker_id)
            for key in (g.worker(worker_id), g.wake(worker_id)):  # a Cluster's slots differ
                pipe.delete(key)
            pipe.execute()

        self._guard("deregister", remove)

    def memory_policy(self) -> str | None:
        """As RedisCalls.memory_policy: CONFIG GET, else INFO memory; None when neither
        answers."""
        def read() -> str | None:
            try:
                if not self._config_denied:
                    try:
                        return worst_policy(self.redis.config_get("maxmemory-policy"),
                                            "maxmemory-policy")
                    except ResponseError:
                        self._config_denied = True
                return worst_policy(self.redis.info("memory"), "maxmemory_policy")
            except ResponseError:
                return None

        return self._guard("memory_policy", read)

    def dataset(self) -> bytes:
        """The namespace's data-set token: written by the first worker to find none (a new
        namespace, or a Redis that lost its data), read by every heartbeat. A token that
        changed or vanished means Redis lost what it held since it was read. b"": none yet
        (a Redis at maxmemory refuses to write one; the next heartbeat tries again)."""
        key = self.broker.global_keys.dataset

        def read() -> bytes:
            token = self.redis.get(key)
            if token is None:
                try:
                    self.redis.set(key, os.urandom(8).hex(), nx=True)
                except ResponseError as exc:
                    if "maxmemory" not in str(exc):  # as BrokerError.out_of_memory reads it
                        raise
                    return b""
                token = self.redis.get(key)
            return bytes(token or b"")

        return self._guard("dataset", read)
