"""Suspects run alone. A worker killed by one of its handlers (os._exit, a native crash, an
OOM kill) takes every task it ran down with it, and Redis cannot tell which one did it: the
recoverer makes them all suspects without counting the loss against any of them. The worker
that takes a suspect fetches and starts nothing more until its other tasks are done, then
records in Redis that this attempt runs alone and runs it with no task beside it; a loss
during that run is the suspect's own, and only such losses count against max_recoveries
(recover.lua). A suspect whose worker's tasks do not end within SUSPECT_WAIT (a long or
hung handler) runs beside them instead, unmarked: its loss then counts against no task."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from obsq.broker import Broker
from obsq.engine.settlement import attempt_of
from obsq.errors import BrokerError
from obsq.loop import RedisRetry
from obsq.task import Task

log = logging.getLogger("obsq")
SUSPECT_WAIT = 5.0  # seconds a suspect waits for the other tasks of its worker to end


class Suspects:
    def __init__(self, broker: Broker, worker_id: str, recheck: Callable[[], None],
                 wait: float = SUSPECT_WAIT) -> None:
        """`recheck()` is called when the first waiting suspect has waited `wait`."""
        self.broker = broker
        self.worker_id = worker_id
        self.recheck = recheck
        self.wait = wait
        self.waiting: collections.deque[Task] = collections.deque()  # fetched, not started
        self.alone: Task | None = None  # the suspect running alone now
        self._since = 0.0  # when the first waiting suspect began to wait

    @property
    def blocking(self) -> bool:
        """While a suspect waits or runs alone, the worker starts and fetches no other task."""
        return bool(self.waiting) or self.alone is not None

    def hold(self, task: Task) -> None:
        task.context["fetched_at"] = time.monotonic()  # its wait counts from now (Worker)
        if not self.waiting:
            self._wait_from_now()
        self.waiting.append(task)

    def next_to_start(self, busy: int) -> Task | None:
        """The suspect to start now: alone once no other task runs, else beside the others
        once it has waited too long."""
        if self.alone is not None or not self.waiting:
            return None
        if busy == 0:
            task = self.alone = self.waiting.popleft()
        elif time.monotonic() - self._since >= self.wait:
            task = self.waiting.popleft()
            task.suspect = False  # not marked: a loss of this run is not known to be its own
            log.info("suspect task %s (%s) runs beside %d other task(s): they did not end "
                     "within %g s", task.id, task.type, busy, self.wait)
        else:
            return None
        if self.waiting:
            self._wait_from_now()
        return task

    def _wait_from_now(self) -> None:
        self._since = time.monotonic()
        asyncio.get_running_loop().call_later(self.wait, self.recheck)

    def ended(self, task: Task) -> None:
        if task is self.alone:
            self.alone = None

    def take_all(self) -> list[Task]:
        """The waiting suspects, for a draining worker to hand back."""
        tasks = list(self.waiting)
        self.waiting.clear()
        return tasks

    async def start_alone(self, task: Task) -> bool:
        """Record that `task` runs alone; False when its lease was taken over meanwhile.
        Retried while Redis is away: an unmarked run could not be told from a shared one.
        A full Redis refuses the mark: the task then runs unmarked (its loss uncounted),
        as this worker's runs are what drain Redis."""
        retry = RedisRetry("marking a suspect that runs alone")
        while True:
            try:
                return await self.broker.isolate(task.kept_in, attempt_of(task), self.worker_id)
            except BrokerError as exc:
                if exc.out_of_memory:
                    return True
                await asyncio.sleep(retry.failed(exc))
