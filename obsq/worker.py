"""The worker: fetch tasks from Redis, run them in concurrency slots, settle them, and
shut down without losing any.

Fetching blocks on Redis when there is nothing to do (a producer's wake token ends the
wait within milliseconds) and takes as many tasks as there are free slots in one script
call when busy. On SIGTERM/SIGINT the worker stops fetching, lets running handlers finish
within `shutdown_timeout`, hands the rest back to pending at once and deregisters.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import signal
import socket
import time
import uuid
from typing import Any

from obsq import __version__
from obsq.app import App
from obsq.broker import Attempt, Broker, Fetched
from obsq.errors import BrokerError
from obsq.execution import Executor
from obsq.heartbeat import Heartbeat, LeaseKeeper
from obsq.loop import BackgroundLoop
from obsq.maintenance import Forwarder, Janitor, Recoverer
from obsq.settings import (
    ACK_LINGER,
    HEARTBEAT_TTL,
    MAX_FETCH,
    PREFETCH_BELOW_SECONDS,
    PROGRESS_TTL,
    REDIS_RETRY_MAX,
    STOP_WAIT,
    WAIT_TIMEOUT,
    WorkerSettings,
    redis_retry_delay,
)
from obsq.settlement import Settler
from obsq.task import Task
from obsq.throughput import ThroughputCounter

log = logging.getLogger("obsq")


class Worker:
    def __init__(self, app: App, redis_url: str | None = None, *,
                 queues: dict[str, int] | str | None = None, concurrency: int | None = None,
                 strict_priority: bool | None = None, shutdown_timeout: float | None = None,
                 lease_seconds: float | None = None, namespace: str | None = None,
                 max_recoveries: int | None = None, http_port: int | None = None,
                 metrics: bool | None = None, tracing: bool | None = None,
                 settings: WorkerSettings | None = None, handle_signals: bool = True) -> None:
        """Options left as None come from `settings`, else from OBSQ_* variables."""
        given = {"redis_url": redis_url, "queues": queues, "concurrency": concurrency,
                 "strict_priority": strict_priority, "shutdown_timeout": shutdown_timeout,
                 "lease_seconds": lease_seconds, "namespace": namespace,
                 "max_recoveries": max_recoveries, "http_port": http_port,
                 "metrics": metrics, "tracing": tracing}
        if settings is None:
            settings = WorkerSettings.from_env(**given)
        else:
            for name, value in given.items():
                if value is not None:
                    setattr(settings, name, value)
            settings.__post_init__()
        self.settings = settings
        self.app = app
        self.namespace = settings.namespace or app.namespace
        self.queues = settings.queues or dict.fromkeys(app.queues, 1)
        self.concurrency = settings.concurrency
        self.handle_signals = handle_signals
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started_at = 0.0
        self.draining = False
        self.processed = 0
        if settings.metrics or settings.tracing:
            from obsq.observability import instrument_app
            instrument_app(app, metrics=settings.metrics, tracing=settings.tracing,
                           concurrency=self.concurrency, queues=self.queues)
        self.broker = Broker(settings.redis_url, self.namespace)
        self.broker.on_error.extend(app.redis_error_hooks)
        self._order = sorted(self.queues, key=lambda q: -self.queues[q])
        self._busy = 0
        self._buffer: collections.deque[Task] = collections.deque()  # fetched, awaiting a slot
        self._recent_duration = PREFETCH_BELOW_SECONDS  # moving average of handler run time
        self._slot_free = asyncio.Event()
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()
        self._running: dict[asyncio.Task[None], Task] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self._loops: list[BackgroundLoop] = []
        self._http: Any = None

    # -- public ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until stop() or SIGTERM/SIGINT, then drain. Raises ConfigurationError at
        once for a wrong URL, credentials or Redis version."""
        await self.broker.check()
        await self.broker.register_queues(self.queues)
        self.executor = Executor(self.app, self.concurrency, self._update_state)
        self.settler = Settler(self.broker, self.id, self.app.outcome_hooks)
        self.heartbeat = Heartbeat(self.broker, self.id, self.describe)
        await self.heartbeat.beat()
        self._loops = [
            self.heartbeat,
            LeaseKeeper(self.broker, self.id, self.settings.lease_seconds,
                        self._attempts_by_queue),
            Forwarder(self.broker, self.id),
            Recoverer(self.broker, self.id, max_recoveries=self.settings.max_recoveries,
                      hooks=self.app.recovery_hooks),
            Janitor(self.broker, self.id),
            ThroughputCounter(self.app, self.broker),
        ]
        if self.settings.http_port is not None:  # first: a taken port stops the start here
            from obsq.observability import serve_http
            self._http = serve_http(self, self.settings.http_host, self.settings.http_port)
        for loop in self._loops:
            loop.start()
        signals = self._install_signals()
        self.started_at = time.time()
        log.info("worker %s started: queues %s, concurrency %d, Redis %s%s", self.id,
                 ",".join(f"{q}={w}" for q, w in self.queues.items()), self.concurrency,
                 self.broker.url.rpartition("@")[2],
                 f", http on :{self.http_port}" if self._http else "")
        fetcher = asyncio.create_task(self._fetch_forever(), name="obsq-fetch")
        try:
            await self._stopped.wait()
        finally:
            await self._drain(fetcher)
            self._remove_signals(signals)

    def stop(self) -> None:
        """Begin a graceful drain; a second call stops waiting for running handlers."""
        if self._stopped.is_set():
            self._hurry.set()
        self._stopped.set()

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": self.queues, "concurrency": self.concurrency, "busy": self._busy,
                "started": self.started_at, "version": __version__,
                "processed": self.processed, "draining": self.draining}

    def health(self) -> dict[str, Any]:
        """What /healthz and /readyz report; called from the HTTP thread."""
        silent = time.monotonic() - self.heartbeat.last_success
        return {"heartbeat_age": silent,
                "heartbeat_ok": silent < max(HEARTBEAT_TTL, self.settings.lease_seconds),
                "redis_ok": self.heartbeat.failures == 0, "draining": self.draining}

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def http_port(self) -> int | None:
        """The port of the HTTP endpoint once running (a free one when 0 was asked)."""
        return self._http.port if self._http is not None else None

    # -- fetching -------------------------------------------------------------------------

    def _queue_order(self) -> list[str]:
        """Strict: by weight. Weighted: a random order, each queue first in proportion to
        its weight, so low-weight queues are never starved."""
        if self.settings.strict_priority or len(self._order) == 1:
            return self._order
        names, weights, order = list(self._order), [self.queues[q] for q in self._order], []
        while names:
            i = random.choices(range(len(names)), weights)[0]
            order.append(names.pop(i))
            weights.pop(i)
        return order

    async def _fetch_forever(self) -> None:
        """Each cycle sends the completions gathered since the last one together with the
        next fetch, in one round trip; with nothing to fetch, it blocks on Redis."""
        failures = 0
        while not self._stopped.is_set():
            held = self._busy + len(self._buffer)
            prefetching = self._recent_duration < PREFETCH_BELOW_SECONDS
            free = self.concurrency * (2 if prefetching else 1) - held
            try:
                if free <= 0 or (prefetching and held > self.concurrency):
                    await self._await_room()
                    continue
                got = 0
                for queue in self._queue_order():
                    got += await self._fetch(queue, min(free - got, MAX_FETCH))
                    if got >= free:
                        break
                failures = 0
            except BrokerError as exc:
                failures += 1
                if failures == 1:
                    log.warning("cannot reach Redis to fetch tasks: %s; retrying", exc)
                await self._pause(redis_retry_delay(failures))
                continue
            except Exception:
                log.exception("fetching tasks failed; retrying")  # never let the loop die
                await self._pause(REDIS_RETRY_MAX)
                continue
            if not got:
                await self._wait_for_work()

    async def _await_room(self) -> None:
        """Wait until a slot frees. While tasks are short the worker holds up to twice its
        slots and fetches only once a whole batch fits, so each round trip carries many
        tasks; the buffer keeps the slots fed meanwhile."""
        self._slot_free.clear()
        await self.settler.wait_carrying(self._slot_free, ACK_LINGER)

    async def _fetch(self, queue: str, count: int) -> int:
        """Take up to `count` tasks of `queue`; the completions gathered so far ride along."""
        fetched = await self.settler.riding(lambda completions, resent: self.broker.dequeue(
            queue, count, self.id, self.settings.lease_seconds, completions, resent))
        self._take(queue, fetched)
        return len(fetched.tasks)

    def _take(self, queue: str, fetched: Fetched) -> None:
        """Start fetched tasks in free slots; the rest wait in the buffer (all of them once
        the worker is stopping: the drain hands the buffer back)."""
        fetched_at = time.monotonic()
        for raw in fetched.tasks:
            task = self.executor.build_task(queue, raw, fetched.now_ms)
            if self._busy < self.concurrency and not self._stopped.is_set():
                self._start(task)
            else:
                task.context["fetched_at"] = fetched_at
                self._buffer.append(task)

    async def _wait_for_work(self) -> None:
        """Block on Redis until a producer signals a queue, with the fetch of the first queue
        riding behind the wait. Meanwhile completions of running tasks are sent on their
        own, and a stop interrupts the wait through the worker's own wake list."""
        self._slot_free.clear()
        if self.settler.acks_waiting.is_set():
            return
        first = self._queue_order()[0]
        count = min(self.concurrency - self._busy, MAX_FETCH)
        waiter = asyncio.ensure_future(self.broker.wait_and_dequeue(
            list(self.queues), WAIT_TIMEOUT, first, count, self.id,
            self.settings.lease_seconds))
        interrupted = False
        try:
            while not waiter.done():
                events = [] if interrupted else [asyncio.ensure_future(e.wait())
                                                 for e in (self._stopped, self._slot_free)]
                await asyncio.wait([waiter, *events], return_when=asyncio.FIRST_COMPLETED,
                                   timeout=STOP_WAIT if interrupted else None)
                for event in events:
                    event.cancel()
                if waiter.done():
                    break
                if interrupted:  # Redis did not answer the interruption: give up the wait
                    _abandon(waiter)
                    return
                if self._stopped.is_set():
                    interrupted = True
                    await self._interrupt(waiter)
                    continue
                self._slot_free.clear()
                if self.settler.acks_waiting.is_set():
                    with contextlib.suppress(BrokerError):  # kept for the next try
                        await self.settler.flush()
            if waiter.cancelled():  # abandoned on a stop (a Cluster's plain wait)
                return
            _, fetched = await waiter
        except asyncio.CancelledError:
            if not waiter.done():
                waiter.cancel()
            raise
        except BrokerError:
            await self._pause(REDIS_RETRY_MAX)  # Redis away; the broker counted it
            return
        self._take(first, fetched)
        await asyncio.sleep(0)  # let the handlers just started begin before the next fetch

    async def _interrupt(self, waiter: asyncio.Future[Any]) -> None:
        if self.broker.is_cluster:
            _abandon(waiter)  # a plain wait: nothing rides behind it
            return
        try:
            await self.broker.interrupt_wait(self.id)
        except BrokerError:
            _abandon(waiter)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout=seconds)

    # -- running --------------------------------------------------------------------------

    def _start(self, task: Task) -> None:
        fetched_at = task.context.pop("fetched_at", None)
        if fetched_at is not None:  # waited in the buffer too
            task.wait_seconds += time.monotonic() - fetched_at
        self._busy += 1
        runner = asyncio.create_task(self._process(task))
        self._running[runner] = task
        self._handling.add(runner)

    async def _process(self, task: Task) -> None:
        runner = asyncio.current_task()
        started = time.monotonic()
        try:
            verdict = await self.executor.run(task)
        except asyncio.CancelledError:
            del self._running[runner]  # type: ignore[index]
            return  # the drain hands it back
        finally:
            self._busy -= 1
            self._handling.discard(runner)  # type: ignore[arg-type]
            if self._buffer and not self.draining:
                self._start(self._buffer.popleft())
            self._slot_free.set()
        self._recent_duration += (time.monotonic() - started - self._recent_duration) * 0.1
        try:
            await self.settler.settle(task, verdict)
            self.processed += 1
        finally:
            del self._running[runner]  # type: ignore[index]

    def _attempts_by_queue(self) -> dict[str, list[Attempt]]:
        attempts: dict[str, list[Attempt]] = {}
        for task in [*self._running.values(), *self._buffer]:
            attempts.setdefault(task.queue, []).append(Attempt(task.id, task.fence))
        return attempts

    async def _update_state(self, task: Task, state: Any) -> None:
        await self.broker.set_progress(task.queue, task.id, state, PROGRESS_TTL)

    # -- stopping -------------------------------------------------------------------------

    async def _drain(self, fetcher: asyncio.Task[None]) -> None:
        self.draining = True
        self._stopped.set()
        self._slot_free.set()  # a fetcher waiting for room sees the stop and ends
        # Not cancelled: a fetch cut short would strand the completions it carries (their
        # handlers would wait for them until the shutdown timeout) and the tasks it took.
        if not (await asyncio.wait([fetcher], timeout=15))[0]:
            fetcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetcher
        self.settler.direct = True  # no fetch loop carries completions any more
        with contextlib.suppress(BrokerError):
            await self.settler.flush()
        if self._buffer:
            await self.settler.hand_back(list(self._buffer))
            self._buffer.clear()
        log.info("worker %s draining: %d task(s) running, waiting up to %g s", self.id,
                 len(self._handling), self.settings.shutdown_timeout)
        if self._handling:
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait([asyncio.gather(*self._handling, return_exceptions=True), hurry],
                               timeout=self.settings.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
        cancelled = list(self._handling)
        unfinished = [self._running[r] for r in cancelled]
        for runner in cancelled:
            runner.cancel()
        if unfinished:
            await asyncio.gather(*cancelled, return_exceptions=True)
            await self.settler.hand_back(unfinished)
            log.info("handed %d unfinished task(s) back to pending", len(unfinished))
        await self.settler.close(timeout=5)
        settling = [r for r in self._running if not r.done()]
        if settling:
            await asyncio.wait(settling, timeout=5)
        for loop in reversed(self._loops):
            await loop.stop()
        self.executor.close()
        if self._http is not None:
            self._http.close()
        await self.broker.close()
        log.info("worker %s stopped: %d task(s) processed", self.id, self.processed)

    def _install_signals(self) -> list[int]:
        if not self.handle_signals:
            return []
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or not supported here
        return installed

    def _on_signal(self, sig: int) -> None:
        log.info("received %s: %s", signal.Signals(sig).name,
                 "stopping now" if self._stopped.is_set() else "draining")
        self.stop()

    def _remove_signals(self, signals: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.remove_signal_handler(sig)


def _abandon(waiter: asyncio.Future[Any]) -> None:
    """Cancel a wait nobody will await, and consume its outcome so asyncio does not log it
    (redis-py may finish a cancelled BLPOP only at its timeout)."""
    waiter.cancel()
    waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
