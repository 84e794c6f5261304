"""Redis calls without an event loop, on a blocking redis-py client: `BlockingCalls` (a
broker's scripts, called by SHA and loaded again after NOSCRIPT, failures reported as the
broker's own), and on it the SyncClient's enqueues, in the caller's own thread. A sync web
app's request then pays one round trip per enqueue, not a hand-over to an event-loop
thread and back. (A worker's heartbeat thread calls Redis the same way: keeping.py.)

The client is thread safe (a blocking connection pool, bounded like the asyncio one) and
made at the first call, as a Cluster client connects when it is made. One connection
is kept beside the pool for whichever thread finds it free, as the asyncio Client keeps
one: a pool checkout and release cost a third of a round trip on loopback.

No timer can interrupt a blocking call, so the Client's call deadline is the timeout of
every socket read and write, connect and wait for a free connection of this client: a
stopped Redis fails the call with BrokerTimeout, and the connection it was read on is
closed (redis-py and the runner drop a connection that failed halfway), so a late
reply is never read as the answer to the next call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from obsq.broker.calls import BlockingRunner, RedisCalls, ScriptCall
from obsq.broker.connection import create_client
from obsq.broker.producing import Producing, enqueue_statuses
from obsq.broker.records import Enqueued
from obsq.broker.scripts import scripts
from obsq.errors import BrokerError
from obsq.names import stored_count
from obsq.settings import ENQUEUE_BATCH
from obsq.task import TaskMessage


class BlockingCalls:
    """Scripts of `broker`'s namespace on a blocking client of its URL, made at the first
    call; failures are reported and raised as the broker's own (BrokerError, BrokerTimeout
    past `call_timeout`; None: no deadline). `keep`: a connection kept beside the pool."""

    def __init__(self, broker: RedisCalls, call_timeout: float | None = None, *,
                 keep: bool = False) -> None:
        self.broker = broker
        self.call_timeout = call_timeout
        self.runner = BlockingRunner(
            lambda: create_client(broker.url, blocking=True, call_timeout=call_timeout),
            keep=keep, now=lambda: broker.runner.now())

    @property
    def redis(self) -> Any:
        return self.runner.redis

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = scripts()[name]
        try:
            return self.runner.call(script, keys, args)
        except (RedisError, OSError) as exc:
            raise self._failure(script.operation, exc) from exc

    def _scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Several script calls (name, keys, args), one after the other."""
        return [self._script(name, keys, args) for name, keys, args in calls]

    def _guard(self, operation: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (RedisError, OSError) as exc:
            raise self._failure(operation, exc) from exc

    def _failure(self, operation: str, exc: BaseException) -> BrokerError:
        if self.call_timeout is not None and (
                isinstance(exc, (RedisTimeoutError, TimeoutError))
                or (isinstance(exc, RedisConnectionError) and _no_free_connection(exc))):
            return self.broker.timed_out(operation, self.call_timeout)
        return self.broker.failed(operation, exc)

    def close(self) -> None:
        self.runner.close()


class BlockingProducer(BlockingCalls):
    """The Redis calls of an enqueue for `broker`'s namespace, blocking, on a connection kept
    beside the pool for whichever thread finds it free: the SyncClient's transport of the
    enqueue step (obsq/producer/enqueue.py)."""

    broker: Producing

    def __init__(self, broker: Producing, call_timeout: float) -> None:
        super().__init__(broker, call_timeout, keep=True)

    def partition_counts(self, queues: Sequence[str]) -> dict[str, int]:
        """As the asyncio broker's stored_counts (producing.py)."""
        key = self.broker.global_keys.partitions
        try:
            found = self.redis.hmget(key, list(queues))
        except (RedisError, OSError) as exc:
            if not self.broker.junk_registry(key, exc):
                raise self._failure("partition_counts", exc) from exc
            found = [None] * len(queues)
        return dict(zip(queues, map(stored_count, found)))

    def enqueue(self, queue: str, messages: Sequence[TaskMessage]) -> list[Enqueued]:
        """Write the messages of one queue, ENQUEUE_BATCH a script call."""
        statuses: list[Enqueued] = []
        for start in range(0, len(messages), ENQUEUE_BATCH):
            batch = messages[start:start + ENQUEUE_BATCH]
            reply = self._script(*self.broker.enqueue_call(queue, batch))
            statuses += enqueue_statuses(reply, len(batch))
        return statuses


def _no_free_connection(exc: RedisConnectionError) -> bool:
    """The blocking pool's wait for a free connection ran out (redis-py says so in words)."""
    return "No connection available" in str(exc)
