"""The lifecycle every background loop shares (heartbeat, lease keeper, forwarder,
recoverer, janitor, scheduler): `start()`, `stop()`, and a `tick()` that says when to
run next. A failing tick is logged and retried with backoff; it never ends the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from obsq.errors import BrokerError
from obsq.settings import redis_retry_delay

log = logging.getLogger("obsq")


class BackgroundLoop:
    name = "loop"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    async def tick(self) -> float | None:
        """Do one round; return the seconds until the next (None: the interval)."""
        raise NotImplementedError

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name=f"obsq-{self.name}")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                wait = await self.tick()
                if self.failures:
                    log.info("%s: Redis reachable again", self.name)
                self.failures = 0
            except BrokerError as exc:
                self.failures += 1
                if self.failures == 1:
                    log.warning("%s: %s; retrying", self.name, exc)
                wait = redis_retry_delay(self.failures)
            except Exception:
                log.exception("%s failed; retrying in %.1f s", self.name, self.interval)
                wait = None
            await self.sleep(self.interval if wait is None else wait)

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when stopped."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=max(seconds, 0))
