"""What the liveness and readiness probes of the scheduler and exporter judge by: whether
an event loop still runs callbacks, and whether Redis answered the last ping (a worker's
checks are obsq/engine/liveness.py's). Each check returns None when all is
well, else the reason, which the endpoint sends back with its 503."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from obsq.broker import Broker
from obsq.errors import BrokerError
from obsq.settings import LOOP_TIMEOUT, PING_INTERVAL

log = logging.getLogger("obsq")
Check = Callable[[], "str | None"]  # None: fine; else why not


def loop_answers(loop: asyncio.AbstractEventLoop, timeout: float = LOOP_TIMEOUT) -> bool:
    """True if `loop` runs a callback within `timeout` seconds (call from another thread)."""
    answered = threading.Event()
    try:
        loop.call_soon_threadsafe(answered.set)
    except RuntimeError:  # closed
        return False
    return answered.wait(timeout)


def loop_liveness(loop: asyncio.AbstractEventLoop) -> Check:
    """The liveness check of a scheduler or exporter: its event loop answers (a worker's
    judges its loop's lag against a limit instead: obsq/engine/liveness.py)."""
    def live() -> str | None:
        if not loop_answers(loop):
            return f"the event loop did not answer within {LOOP_TIMEOUT:g} s"
        return None
    return live


class RedisWatch:
    """Pings Redis every PING_INTERVAL, for processes with no loop of their own talking to
    Redis (the exporter, a supervisor); `problem()` is what /readyz reports."""

    def __init__(self, broker: Broker, interval: float = PING_INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self.ok = True
        self.last_ok = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.broker.queues(), timeout=self.interval)
                if not self.ok:
                    log.info("Redis reachable again")
                self.ok, self.last_ok = True, time.monotonic()
            except (BrokerError, asyncio.TimeoutError) as exc:
                if self.ok:
                    log.warning("Redis unreachable: %s", exc or "timeout")
                self.ok = False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)

    def problem(self) -> str | None:
        return None if self.ok else "Redis is unreachable"
