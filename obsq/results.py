"""Waiting for tasks to end, for any number of concurrent `Client.result()` calls.

Each waiter registers the task in Redis under this client's id (`Broker.watch`); the
scripts that end a task push its outcome onto the client's inbox for that queue. One
reader task per client blocks on all of its inboxes at once and hands each outcome to the
waiters of that task, so 2,000 waiters hold one connection between them.

A notice can be lost (a connection that broke after Redis handed it over): the waiters
then look at the task again, at once when the reader saw a failure, and every
RECHECK_SECONDS in any case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

from obsq.broker import Broker, Ended
from obsq.errors import BrokerError, TaskFailed, TaskNotFound
from obsq.settings import REDIS_RETRY_MAX, WAIT_TIMEOUT, redis_retry_delay
from obsq.task import decode_stored_json

log = logging.getLogger("obsq")
RECHECK_SECONDS = 10.0


class ResultWaiter:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.client_id = os.urandom(8).hex()
        self._waiters: dict[tuple[str, str], list[asyncio.Future[Ended | None]]] = {}
        self._listening: tuple[str, ...] = ()  # the queues of the reader's current wait
        self._reader: asyncio.Task[None] | None = None

    async def wait(self, queue: str, task_id: str, timeout: float | None) -> Any:
        """The task's result once it completes; TaskFailed if it ends dead, TimeoutError
        after `timeout`, TaskNotFound if it does not exist (or ended without retention
        while a notice was lost)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        key = (queue, task_id)
        while True:
            future: asyncio.Future[Ended | None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(future)  # before watching, so that no
            try:                                               # end slips between the two
                watched = await self.broker.watch(queue, task_id, self.client_id)
                if watched is None:
                    raise TaskNotFound(f"no task {task_id!r} (a result is kept only with "
                                       "retention)")
                state, result, error = watched
                if state in ("completed", "dead"):
                    return _outcome(task_id, state, result if state == "completed" else error)
                await self._listen()
                ended = await _until(future, deadline, task_id, timeout)
                if ended is not None:
                    return _outcome(task_id, ended.state, ended.value if ended.state ==
                                    "completed" else ended.value.decode(errors="replace"))
            except (TimeoutError, asyncio.TimeoutError, asyncio.CancelledError):
                self._forget(key, future)
                if key not in self._waiters:  # nobody here waits for it any more
                    with contextlib.suppress(BrokerError):
                        await self.broker.unwatch(queue, task_id, self.client_id)
                raise
            finally:
                self._forget(key, future)

    def _forget(self, key: tuple[str, str], future: asyncio.Future[Ended | None]) -> None:
        futures = self._waiters.get(key, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self._waiters.pop(key, None)

    async def _listen(self) -> None:
        """Make sure the reader waits on every queue that has waiters."""
        queues = tuple(sorted({q for q, _ in self._waiters}))
        if self._reader is None or self._reader.done():
            self._listening = queues
            self._reader = asyncio.create_task(self._read(), name="obsq-result-reader")
        elif not set(queues) <= set(self._listening):
            self._listening = queues
            await self.broker.interrupt_inbox(self.client_id)

    async def _read(self) -> None:
        """Hand each end read from the inboxes to its waiters, until none is left."""
        failures = 0
        while self._waiters:
            self._listening = tuple(sorted({q for q, _ in self._waiters}))
            try:
                ends = await self.broker.read_inbox(self._listening, self.client_id,
                                                    WAIT_TIMEOUT)
                failures = 0
            except BrokerError as exc:
                failures += 1
                if failures == 1:
                    log.warning("waiting for results: %s; retrying", exc)
                self._recheck_all()
                await asyncio.sleep(min(redis_retry_delay(failures), REDIS_RETRY_MAX))
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
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, BrokerError):
                await self._reader


async def _until(future: asyncio.Future[Ended | None], deadline: float | None, task_id: str,
                 timeout: float | None) -> Ended | None:
    """The end handed to `future`, or None when it is time to look at the task again."""
    remaining = RECHECK_SECONDS if deadline is None else min(RECHECK_SECONDS,
                                                             deadline - time.monotonic())
    try:
        if remaining <= 0:
            raise asyncio.TimeoutError
        return await asyncio.wait_for(future, remaining)
    except asyncio.TimeoutError:
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"task {task_id} did not finish within {timeout} s") from None
        return None


def _outcome(task_id: str, state: str, value: Any) -> Any:
    if state == "dead":
        raise TaskFailed(task_id, value)
    return decode_stored_json(value)
