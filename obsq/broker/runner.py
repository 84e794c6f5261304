"""The one way obsq calls a script, on an asyncio client (`Runner`) or a blocking one
(`BlockingRunner`): by SHA, loaded again after NOSCRIPT (a restarted or failed-over Redis
has none), alone, in a pipeline, or on a connection kept beside the pool. Every script's
first argument, the time it is to read ("now", in ms; 0: Redis's own clock, TIME), comes
from the runner's `now`, and nowhere else.

The low-level redis-py calls (packed commands, raw replies, the check a pool makes before
lending a connection) live here only: redis-py's major version is pinned in pyproject
while they do. Failures are raised as redis-py raises them; the broker names and reports
them (calls.py)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hiredis import pack_command
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from obsq.broker.connection import kept_connection
from obsq.broker.scripts import Script

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
        queue's batch is using it)."""
        if self.kept is None or self._kept_busy:
            return await self.call(script, keys, args)
        self._kept_busy = True
        try:
            return await _on_connection(self.kept, script, self.words(script, keys, args))
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


# A kept connection is used by one caller at a time, with nothing else in flight on it. Its
# commands are packed by hiredis at once (redis-py's asyncio packer encodes every argument
# in Python: 9 µs of an enqueue's 150). One the server closed while it sat idle (a
# restart) is made again before the call; one that failed or was cancelled halfway is
# closed, as a reply may be left unread on it, and made again at the next call.


async def _on_connection(connection: Any, script: Script, words: tuple) -> Any:
    """`script` on a kept redis-py asyncio connection."""
    try:
        try:
            # the check a pool makes before lending a connection
            stale = connection.is_connected and await connection.can_read()
        except RedisConnectionError:
            stale = True
        if stale:
            await connection.disconnect()
        packed = [pack_command(("EVALSHA", *words))]
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


def _on_blocking_connection(connection: Any, script: Script, words: tuple) -> Any:
    """`script` on a kept redis-py blocking connection."""
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
