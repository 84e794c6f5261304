"""The SyncClient's enqueues without an event loop: the same enqueue script, called on a
blocking redis-py client in the caller's own thread. A sync web app's request then pays
one round trip per enqueue, not a hand-over to an event-loop thread and back.

The client is thread safe (a blocking connection pool, bounded like the asyncio one) and
made at the first enqueue, as a Cluster client connects when it is made.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import RedisError, ResponseError

from obsq.broker.calls import SCRIPTS, RedisCalls
from obsq.broker.connection import create_client
from obsq.broker.producing import enqueue_args, enqueue_statuses
from obsq.broker.records import Enqueued
from obsq.broker.scripts import is_noscript
from obsq.task import TaskMessage


class BlockingProducer:
    """Enqueue and register queues for `broker`'s namespace, blocking; failures are
    reported and raised as the broker's own (BrokerError)."""

    def __init__(self, broker: RedisCalls) -> None:
        self.broker = broker
        self._redis: Any = None
        self._made = threading.Lock()

    @property
    def redis(self) -> Any:
        if self._redis is None:
            with self._made:
                if self._redis is None:
                    self._redis = create_client(self.broker.url, blocking=True)
        return self._redis

    def register_queues(self, queues: Iterable[str]) -> None:
        self._script(*self.broker._register_queues_call(queues))

    def enqueue(self, queue: str, messages: Sequence[TaskMessage]) -> list[Enqueued]:
        """Write the messages of one queue in one script call (at most ENQUEUE_BATCH)."""
        reply = self._script("enqueue", self.broker.enqueue_keys(queue),
                             enqueue_args(messages, self.broker.memory_share))
        return enqueue_statuses(reply, len(messages))

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = SCRIPTS[name]
        try:
            try:
                return self.redis.evalsha(script.sha, len(keys), *keys, *args)
            except ResponseError as exc:
                if not is_noscript(exc):
                    raise
                self.redis.script_load(script.source)
                return self.redis.evalsha(script.sha, len(keys), *keys, *args)
        except (RedisError, OSError) as exc:
            raise self.broker._failed(name, exc) from exc

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
