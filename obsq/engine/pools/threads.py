"""The thread pool of plain handlers: at most `size` serving threads, started as needed.

A thread cannot be stopped, so a handler that overruns its timeout is abandoned: its attempt
ends with TaskTimeout at once, its thread stops serving (it ends when its handler returns)
and no longer counts among the serving ones, so the next handler gets a fresh thread and no
task waits behind a hung one. Abandoned threads still running are the pool's stuck slots.
The threads are daemons: a hung handler never keeps the process alive once the worker has
drained (concurrent.futures' threads are joined at exit, for ever if one never returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from obsq.engine.pools.base import Stuck, overran

if TYPE_CHECKING:
    from obsq.app import Route
    from obsq.task import Task

log = logging.getLogger("obsq")


class _Job:
    __slots__ = ("call", "delivered", "done", "finished", "given_up", "loop", "started_at",
                 "thread", "timer")

    def __init__(self, call: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        self.loop = loop
        self.done: asyncio.Future[Any] = loop.create_future()
        self.timer: asyncio.TimerHandle | None = None
        self.thread: threading.Thread | None = None  # set when its handler starts
        self.started_at: float | None = None  # monotonic
        self.finished = False  # the handler returned or raised
        self.delivered = False  # its outcome reached `done`
        self.given_up = False  # nobody waits for it any more


class ThreadSlots:
    interrupts = False

    def __init__(self, size: int, on_stuck: Callable[[], None]) -> None:
        self.size = size
        self._on_stuck = on_stuck
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = 0  # serving threads free for a job
        self._lock = threading.Lock()
        self._serving: set[threading.Thread] = set()
        self._abandoned: dict[threading.Thread, float] = {}  # -> when it was abandoned

    async def run(self, route: Route, task: Task) -> Any:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the trace span follows into the thread
        job = _Job(lambda: context.run(route.handler, task), loop)
        self._submit(job)
        job.timer = loop.call_later(task.timeout, self._expire, job, task)
        try:
            return await job.done
        finally:
            job.timer.cancel()
            if not job.delivered:  # overran, or the attempt was given up
                self._give_up(job)

    def _expire(self, job: _Job, task: Task) -> None:
        """The timeout counts from the handler's start, which the thread records: the first
        timer runs from the submission, a second one, if need be, to the start's timeout."""
        started = job.started_at
        left = task.timeout if started is None else started + task.timeout - time.monotonic()
        if left > 0:
            job.timer = job.loop.call_later(left, self._expire, job, task)
        elif not job.done.done():
            log.warning("task %s (%s) overran its timeout of %g s: its thread is left to "
                        "finish as a stuck slot, and a fresh one serves the slot", task.id,
                        task.type, task.timeout)
            job.done.set_exception(overran(task.timeout))

    def _submit(self, job: _Job) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._idle:
                self._idle -= 1  # a free thread takes it
            elif len(self._serving) < self.size:
                thread = threading.Thread(target=self._serve, daemon=True,
                                          name=f"obsq-handler-{len(self._serving)}")
                self._serving.add(thread)
                thread.start()

    def _give_up(self, job: _Job) -> None:
        """The attempt ended (timeout, cancelled) before its handler returned: a handler not
        started never starts; a running one's thread is abandoned and replaced."""
        with self._lock:
            job.given_up = True
            thread = job.thread
            if thread is None or job.finished:
                return
            self._serving.discard(thread)
            self._abandoned[thread] = time.monotonic()
        self._on_stuck()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.given_up:  # before it started: free for the next one
                    self._idle += 1
                    continue
                job.thread, job.started_at = me, time.monotonic()
            try:
                outcome: tuple[bool, Any] = (True, job.call())
            except BaseException as exc:  # handed to the attempt, whatever it is
                outcome = (False, exc)
            with self._lock:
                job.finished = True
                abandoned = self._abandoned.pop(me, None) is not None
                if not abandoned:
                    self._idle += 1
            if abandoned:  # a fresh thread serves in its stead
                self._call_soon(job.loop, self._on_stuck)
                return
            self._call_soon(job.loop, _settle, job, outcome)
            del outcome

    @staticmethod
    def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None],
                   *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
            loop.call_soon_threadsafe(callback, *args)

    def stuck(self) -> Stuck:
        with self._lock:
            since = min(self._abandoned.values(), default=None)
            count = len(self._abandoned)
        return Stuck(count, time.monotonic() - since if since is not None else 0.0)

    def close(self) -> None:
        with self._lock:
            serving = len(self._serving)
        for _ in range(serving):
            self._jobs.put(None)


def _settle(job: _Job, outcome: tuple[bool, Any]) -> None:
    if job.given_up or job.done.done():  # nobody would read it
        return
    job.delivered = True
    ok, value = outcome
    if ok:
        job.done.set_result(value)
    else:
        job.done.set_exception(value)
