"""Waiting for tasks to end, for any number of concurrent `Client.result()` calls.

Each waiter registers the task in Redis under this client's id (`Broker.watch`); the
scripts that end a task push its outcome onto the client's inbox for that queue. One
reader task per client blocks on all of its inboxes at once and hands each outcome to the
waiters of that task, so 2,000 waiters hold one connection between them. (On a Redis
Cluster, whose inboxes live in different slots, there is one reader per queue.)

A notice can be lost (a connection that broke after Redis handed it over): the waiters
then look at the task again, at once when the reader saw a failure, and every
RESULT_RECHECK in any case.

Each Redis call made for a waiter gets the Client's call deadline (the reader's blocking
read that plus its own wait), so a stopped Redis ends a `result(timeout=)` on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from obsq.background import RedisRetry
from obsq.broker import Broker, Ended
from obsq.broker.calls import Deadlines
from obsq.errors import (
    EXPIRED_PREFIX,
    BrokerError,
    ResultTimeout,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskNotFound,
)
from obsq.settings import RESULT_READ_TIMEOUT, RESULT_RECHECK
from obsq.task import decode_stored_json


class ResultWaiter:
    def __init__(self, broker: Broker, deadlines: Deadlines) -> None:
        self.broker = broker
        self.deadlines = deadlines  # the Client's
        self.read_deadlines = Deadlines(seconds=RESULT_READ_TIMEOUT + deadlines.seconds,
                                        error=broker.timed_out)
        self.client_id = os.urandom(8).hex()
        self._waiters: dict[tuple[str, str], list[asyncio.Future[Ended | None]]] = {}
        # by group (a queue on a Cluster, else "" for all): its reader, and the queues of
        # the reader's current wait
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._listening: dict[str, tuple[str, ...]] = {}
        self._unwatching: set[asyncio.Task[None]] = set()

    async def wait(self, queue: str, task_id: str, timeout: float | None) -> Any:
        """The task's result once it completes; TaskFailed if it ends dead (TaskCancelled
        when cancelled), ResultTimeout after `timeout`, TaskNotFound if it does not exist
        (or ended without retention while a notice was lost)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        key = (queue, task_id)
        while True:
            future: asyncio.Future[Ended | None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(future)  # before watching, so that no
            try:                                               # end slips between the two
                watched = await self.deadlines.run("watch", self.broker.watch(
                    queue, task_id, self.client_id))
                if watched is None:
                    raise TaskNotFound(f"no task {task_id!r} (a result is kept only with "
                                       "retention)")
                state, result, error = watched
                if state in ("completed", "dead", "cancelled"):
                    return _outcome(task_id, state, result if state == "completed" else error)
                await self._listen(queue)
                ended = await _until(future, deadline, task_id, timeout)
                if ended is not None:
                    return _outcome(task_id, ended.state, ended.value if ended.state ==
                                    "completed" else ended.value.decode(errors="replace"))
            except (TimeoutError, asyncio.TimeoutError, asyncio.CancelledError):
                self._forget(key, future)
                if key not in self._waiters:  # nobody here waits for it any more
                    self._unwatch(queue, task_id)
                raise
            finally:
                self._forget(key, future)

    def _unwatch(self, queue: str, task_id: str) -> None:
        """Stop the task's end being sent to this client, in the background: the caller's
        wait is over, and a Redis slow to answer must not make it longer."""
        async def unwatch() -> None:
            with contextlib.suppress(BrokerError):
                await self.deadlines.run("watch", self.broker.unwatch(queue, task_id,
                                                                      self.client_id))
        task = asyncio.ensure_future(unwatch())
        self._unwatching.add(task)
        task.add_done_callback(self._unwatching.discard)

    def _forget(self, key: tuple[str, str], future: asyncio.Future[Ended | None]) -> None:
        futures = self._waiters.get(key, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self._waiters.pop(key, None)

    def _group(self, queue: str) -> str:
        return queue if self.broker.is_cluster else ""

    def _queues_of(self, group: str) -> tuple[str, ...]:
        return tuple(sorted({q for q, _ in self._waiters if self._group(q) == group}))

    async def _listen(self, queue: str) -> None:
        """Make sure a reader waits on `queue`'s inbox."""
        group = self._group(queue)
        reader = self._readers.get(group)
        if reader is None or reader.done():
            self._listening[group] = self._queues_of(group)
            self._readers[group] = asyncio.create_task(self._read(group),
                                                       name="obsq-result-reader")
        elif queue not in self._listening[group]:
            listened = self._listening[group]
            self._listening[group] = self._queues_of(group)
            await self.deadlines.run("read_inbox", self.broker.interrupt_inbox(
                listened[0], self.client_id))

    async def _read(self, group: str) -> None:
        """Hand each end read from the group's inboxes to its waiters, until none is left."""
        retry = RedisRetry("waiting for results")
        while self._queues_of(group):
            self._listening[group] = queues = self._queues_of(group)
            try:
                ends = await self.read_deadlines.run("read_inbox", self.broker.read_inbox(
                    queues, self.client_id, RESULT_READ_TIMEOUT))
                retry.succeeded()
            except BrokerError as exc:
                self._recheck_all()
                await asyncio.sleep(retry.failed(exc))
                continue
            for ended in ends:
                for future in self._waiters.get((ended.queue, ended.task_id), []):
                    if not future.done():
                        future.set_result(ended)

    def _recheck_all(self) -> None:
        """A notice may have been lost with a failed read: every waiter looks again."""
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        await asyncio.gather(*self._unwatching)
        for reader in self._readers.values():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, BrokerError):
                await reader


async def _until(future: asyncio.Future[Ended | None], deadline: float | None, task_id: str,
                 timeout: float | None) -> Ended | None:
    """The end handed to `future`, or None when it is time to look at the task again."""
    remaining = RESULT_RECHECK if deadline is None else min(RESULT_RECHECK,
                                                            deadline - time.monotonic())
    try:
        if remaining <= 0:
            raise asyncio.TimeoutError
        return await asyncio.wait_for(future, remaining)
    except asyncio.TimeoutError:
        if deadline is not None and time.monotonic() >= deadline:
            raise waited_too_long(task_id, timeout or 0.0) from None
        return None


def _outcome(task_id: str, state: str, value: Any) -> Any:
    if state == "cancelled":
        raise TaskCancelled(task_id)
    if state == "dead" and isinstance(value, str) and value.startswith(EXPIRED_PREFIX):
        raise TaskExpired(task_id, value)
    if state == "dead":
        raise TaskFailed(task_id, value)
    return decode_stored_json(value)


def waited_too_long(task_id: str, timeout: float, what: str = "task") -> ResultTimeout:
    return ResultTimeout(f"{what} {task_id} did not finish within the {timeout:g} s result() "
                         "waits")
