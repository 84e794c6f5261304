"""What wakes a relay, and which relay leads.

On PostgreSQL a relay keeps one connection of its own: it LISTENs there on the table's
channel (Outbox.enqueue's NOTIFY, delivered at each commit), and takes the table's session
advisory lock there, so that one relay at a time moves rows and they reach Redis in order.
The lock goes with the connection: a relay SIGKILLed, or cut off, loses it as its socket
closes, and a waiting relay takes over within LEAD_RETRY. Elsewhere (SQLite) the relay
looks for rows every poll interval and always leads."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from sqlalchemy import Engine

log = logging.getLogger("obsq.outbox")

LEAD_RETRY = 1.0  # seconds between a waiting relay's tries of the lock; also the reconnect pause


async def _first(stopping: asyncio.Event, event: asyncio.Event, timeout: float) -> None:
    """Return when `event` or `stopping` is set, or after `timeout`."""
    waits = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(event.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class Wakeup:
    """Polling: the relay always leads, and looks again after each poll interval."""

    def __init__(self) -> None:
        self._woken = asyncio.Event()

    async def __aenter__(self) -> Wakeup:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        return None

    @property
    def leading(self) -> bool:
        """Whether this relay is the one moving the table's rows."""
        return True

    async def lead(self, stopping: asyncio.Event, interval: float) -> bool:
        """Whether this relay moves rows now; False after waiting up to `interval`."""
        return True

    def clear(self) -> None:
        self._woken.clear()

    async def wait(self, stopping: asyncio.Event, interval: float) -> None:
        """Until woken (a notification since clear()), stopping, or `interval` passed."""
        await _first(stopping, self._woken, interval)


class PostgresWakeup(Wakeup):
    def __init__(self, conninfo: str, channel: str) -> None:
        super().__init__()
        self.conninfo = conninfo
        self.channel = channel
        self._leading = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Wakeup:
        self._listener = asyncio.ensure_future(self._listen())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    async def lead(self, stopping: asyncio.Event, interval: float) -> bool:
        if not self._leading.is_set():
            await _first(stopping, self._leading, interval)
        return self._leading.is_set()

    async def _listen(self) -> None:
        """The connection's one user: takes the lock when free, hears the notifications;
        connects again after a failure (a restarted server), the lock then lost."""
        import psycopg  # the outbox extra's; only a PostgreSQL relay needs it

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo,
                                                                 autocommit=True) as conn:
                    await conn.execute(f'LISTEN "{self.channel}"')
                    self._woken.set()  # rows may have come while nobody listened
                    while True:
                        if not self._leading.is_set():
                            cursor = await conn.execute(
                                "SELECT pg_try_advisory_lock(hashtext(%s))",
                                (f"obsq outbox {self.channel}",))
                            row = await cursor.fetchone()
                            if row is not None and row[0]:
                                log.info("outbox %s: this relay leads", self.channel)
                                self._leading.set()
                        async for _ in conn.notifies(timeout=LEAD_RETRY):
                            self._woken.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._leading.is_set():
                    log.warning("outbox %s: lost the relay's connection (%s): no longer "
                                "leading; connecting again", self.channel, exc)
                else:
                    log.warning("outbox %s: the relay's connection failed (%s); connecting "
                                "again", self.channel, exc)
                self._leading.clear()
                await asyncio.sleep(LEAD_RETRY)


def wakeup_for(engine: Engine, table_name: str) -> Wakeup:
    """LISTEN/NOTIFY and the lead lock on PostgreSQL, polling elsewhere."""
    if engine.dialect.name != "postgresql":
        return Wakeup()
    url = engine.url.set(drivername="postgresql")
    return PostgresWakeup(url.render_as_string(hide_password=False), table_name)
