"""The thread pool of plain handlers: at most `size` threads, started as needed, each
running one handler at a time.

A thread cannot be stopped, so a handler that overruns its timeout keeps its thread, and
its attempt keeps the worker's slot and claim, until it returns: the pool sets
`task.cancelled` (a handler that looks there can stop early) and counts the slot as stuck;
once the handler has returned, whatever it returned, the attempt ends with TaskTimeout, and
only then may it be retried. So two attempts of one task never run at once, and hung
handlers never hold more threads than the worker has slots: with every slot stuck the
worker takes no more tasks, and liveness fails once one has been stuck past the limit
(obsq/engine/liveness.py). The process pool is the one that ends an overrunning handler at
once (it kills its child).
The threads are daemons: a hung handler never keeps the process alive once the worker has
drained (concurrent.futures' threads are joined at exit, for ever if one never returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from obsq.engine.pools.base import Stuck, overran

if TYPE_CHECKING:
    from obsq.app import Route
    from obsq.task import Task

log = logging.getLogger("obsq")
Outcome = tuple[bool, Any]  # (returned, its value) or (raised, the exception)


class _Job:
    __slots__ = ("call", "done", "finished", "given_up", "loop", "started_at", "timer",
                 "was_cancelled")

    def __init__(self, call: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        self.loop = loop
        self.done: asyncio.Future[Outcome] = loop.create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.started_at: float | None = None  # monotonic, set when its handler starts
        self.finished = False  # the handler returned or raised
        self.given_up = False  # nobody waits for it any more
        self.was_cancelled: bool | None = None  # task.cancelled before its timeout set it


class ThreadSlots:
    interrupts = False

    def __init__(self, size: int, on_stuck: Callable[[], None]) -> None:
        self.size = size
        self._on_stuck = on_stuck
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = 0  # threads free for a job
        self._threads = 0  # threads started
        self._lock = threading.Lock()
        self._overran: dict[_Job, float] = {}  # running past their timeout -> since when

    async def run(self, route: Route, task: Task) -> Any:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the trace span follows into the thread
        job = _Job(lambda: context.run(route.handler, task), loop)
        self._submit(job)
        job.timer = loop.call_later(task.timeout, self._expire, job, task)
        try:
            returned, value = await job.done
        except asyncio.CancelledError:
            with self._lock:
                job.given_up = True  # one not started never starts
            if job.was_cancelled is None:
                raise  # the drain hands it back; its handler finishes on its own
            # The drain gives up on an attempt past its timeout: its verdict was only
            # waiting for its thread, which the worker's exit ends.
            current = asyncio.current_task()
            if sys.version_info >= (3, 11) and current is not None:
                current.uncancel()
        finally:
            job.timer.cancel()
        if job.was_cancelled is not None:
            task.cancelled = job.was_cancelled  # the attempt is judged by its timeout
            raise overran(task.timeout)
        if returned:
            return value
        raise value

    def _expire(self, job: _Job, task: Task) -> None:
        """The timeout counts from the handler's start, which the thread records: the first
        timer runs from the submission, a second one, if need be, to the start's timeout."""
        started = job.started_at
        left = task.timeout if started is None else started + task.timeout - time.monotonic()
        if left > 0:
            job.timer = job.loop.call_later(left, self._expire, job, task)
            return
        with self._lock:
            if job.finished:  # its outcome is on its way
                return
            self._overran[job] = time.monotonic()
        job.was_cancelled, task.cancelled = task.cancelled, True
        log.warning("task %s (%s) overran its timeout of %g s: task.cancelled is set, and "
                    "its slot is stuck until the handler returns (a thread cannot be "
                    "stopped); its attempt then ends with TaskTimeout", task.id, task.type,
                    task.timeout)
        self._on_stuck()

    def _submit(self, job: _Job) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._idle:
                self._idle -= 1  # a free thread takes it
            elif self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._serve, daemon=True,
                                 name=f"obsq-handler-{self._threads - 1}").start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.given_up:  # before it started: free for the next one
                    self._idle += 1
                    continue
                job.started_at = time.monotonic()
            try:
                outcome: Outcome = (True, job.call())
            except BaseException as exc:  # handed to the attempt, whatever it is
                outcome = (False, exc)
            with self._lock:
                job.finished = True
                self._idle += 1
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
                job.loop.call_soon_threadsafe(self._finished, job, outcome)
            del outcome

    def _finished(self, job: _Job, outcome: Outcome) -> None:
        """On the event loop: a handler returned, to its attempt if one still waits."""
        with self._lock:
            was_stuck = self._overran.pop(job, None) is not None
        if not job.done.done():
            job.done.set_result(outcome)
        if was_stuck:
            self._on_stuck()

    def stuck(self) -> Stuck:
        with self._lock:
            since = min(self._overran.values(), default=None)
            count = len(self._overran)
        return Stuck(count, time.monotonic() - since if since is not None else 0.0)

    def close(self) -> None:
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)
