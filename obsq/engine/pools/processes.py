"""The process pool of plain handlers (`--pool process`): up to `size` child processes,
started as plain tasks need them and kept for the next ones, each running one handler at a
time (`child.py`). A child whose handler overruns its timeout, or whose attempt is given up
(the task was cancelled, the worker stops), is killed and replaced; one that dies by itself
(os._exit, a native crash, an OOM kill) fails only its own attempt, with HandlerCrashed.
A child past its limits (`recycling`: tasks run, or resident memory, which it reads after
each task) says so with its reply, and is replaced once the attempt it ran has its end.

Children come from multiprocessing's fork server where the platform has one, which imports
obsq and the App's module once, so that a replacement starts in milliseconds and without
copying the worker's threads and connections (a plain fork would); else they are spawned.
Each talks to the worker over a pipe of its own that the event loop watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import sys
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from obsq.broker.calls import Deadlines
from obsq.engine.pools.base import RemoteTraceback, Stuck, UnsentResult, timed_out
from obsq.engine.pools.child import child_setups, serve
from obsq.engine.recycling import NO_RECYCLING, Recycling
from obsq.errors import ConfigurationError, HandlerCrashed, TaskTimeout

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

    from obsq.app import App, Route
    from obsq.task import Task

log = logging.getLogger("obsq")
REAP_TIMEOUT = 5.0  # seconds to wait for a killed child's exit status


class _Child:
    def __init__(self, process: BaseProcess, conn: Connection, lifeline: Connection) -> None:
        self.process = process
        self.conn = conn
        self.lifeline = lifeline  # never written: it ends when the worker does
        self.alive = True  # until its end of the pipe closes, or it is killed
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reply: asyncio.Future[Any] | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read its messages as they come: one reader for its life, not one per task."""
        self._loop, self._fd = loop, self.conn.fileno()
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError):  # it died
            message = None
            self._stop_watching()
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(message)

    async def reply(self) -> Any:
        """The child's next message; None when it died before sending one."""
        assert self._loop is not None
        self._reply = self._loop.create_future()
        try:
            return await self._reply
        finally:
            self._reply = None

    def _stop_watching(self) -> None:
        if self.alive and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self.alive = False

    async def death(self) -> str:
        await asyncio.to_thread(self.process.join, REAP_TIMEOUT)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}" if code is not None else "it no longer answers"

    def kill(self) -> None:
        self._stop_watching()  # before its descriptor is closed and reused
        self.conn.close()
        self.lifeline.close()
        with contextlib.suppress(OSError, ValueError):  # gone already, or closed
            self.process.kill()


class ProcessSlots:
    interrupts = True

    def __init__(self, size: int, app: App, recycling: Recycling = NO_RECYCLING) -> None:
        self.size = size
        self.app = app
        self.recycling = recycling
        self.app_path = import_path(app)
        self._context = _start_context(self.app_path)
        self._idle: list[_Child] = []
        self._live = 0  # children started and not killed: in use, idle or just started
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False
        self._deadlines = Deadlines()  # the children's timeouts

    async def run(self, route: Route, task: Task) -> Any:
        child = await self._take()
        try:
            try:
                child.conn.send((task.portable(), _trace_carrier()))
            except OSError:  # it died while idle, unnoticed so far
                reply = None
            else:
                reply = await self._deadlines.run(task.type, child.reply(), task.timeout,
                                                   timed_out)
            if reply is None:
                raise HandlerCrashed(f"the process running the handler of task {task.id} "
                                     f"({task.type}, pid {child.process.pid}) died before it "
                                     f"returned: {await child.death()}; it is replaced")
        except TaskTimeout:
            log.warning("task %s (%s) overran its timeout of %g s: its process (pid %s) is "
                        "killed and replaced", task.id, task.type, task.timeout,
                        child.process.pid)
            # its end waits for the child's: a retry never runs beside the killed handler
            await asyncio.shield(self._replace(child))
            raise
        except BaseException:  # given up (cancelled, the worker stops), or the child died
            self._replace(child)
            raise
        retiring, kind, value, *details = reply
        if retiring is None:
            self._keep(child)
        else:
            self._retire(child, *retiring)
        if kind == "ok":
            return value
        if kind == "unsent":
            return UnsentResult(value)
        value.__cause__ = RemoteTraceback(*details)
        raise value

    async def _take(self) -> _Child:
        while self._idle:
            child = self._idle.pop()
            if child.alive:
                return child
            self._kill(child)  # died while idle: the child started below takes its place
        return await self._started()

    async def _started(self) -> _Child:
        self._live += 1
        try:
            child = await asyncio.to_thread(self._spawn)
        except BaseException:
            self._live -= 1
            raise
        child.watch(asyncio.get_running_loop())
        return child

    def _spawn(self) -> _Child:
        ours, theirs = self._context.Pipe()
        lifeline, held = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=serve, args=(theirs, lifeline, self.app_path, child_setups(),
                                self.recycling),
            name="obsq-handler", daemon=True)
        process.start()
        theirs.close()  # the child's ends: only the child may hold them, so that its death
        lifeline.close()  # is EOF on ours, and the worker's on its lifeline
        return _Child(process, ours, held)

    def _replace(self, child: _Child) -> asyncio.Future[None]:
        """Kill `child` and start another in its place, both off the event loop (unless
        the slots have their children already: an attempt that found none started one);
        the killed child's reaping."""
        reaped = self._kill(child)
        if not self._closed and self._live < self.size:
            self._in_background(self._refill())
        return reaped

    def _retire(self, child: _Child, reason: str, words: str) -> None:
        """Replace `child`, past its limits, its attempt ended: idle, it is killed."""
        log.info("handler process pid %s replaced %s", child.process.pid, words)
        self._replace(child)
        self.app.recycle_hooks(reason)

    def _kill(self, child: _Child) -> asyncio.Future[None]:
        """Kill `child`; its reaping, in the background."""
        child.kill()
        self._live -= 1
        return self._in_background(asyncio.to_thread(child.process.join, REAP_TIMEOUT))

    async def _refill(self) -> None:
        self._keep(await self._started())

    def _keep(self, child: _Child) -> None:
        """Keep `child` for the next task, unless the slots closed meanwhile, or hold more
        children than their size (an attempt that found none idle while a replacement was
        starting started one of its own)."""
        if self._closed or self._live > self.size:
            self._kill(child)
        else:
            self._idle.append(child)

    def _in_background(self, work: Any) -> asyncio.Future[Any]:
        future = asyncio.ensure_future(work)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        return future

    def stuck(self) -> Stuck:
        return Stuck()  # an overrunning handler's process is killed, never left running

    def close(self) -> None:
        self._closed = True
        for child in self._idle:
            child.kill()
        for child in self._idle:
            child.process.join(REAP_TIMEOUT)
        self._idle.clear()


def import_path(app: App) -> str:
    """"module:attribute" of `app`, which each child imports: as `obsq worker` was given it,
    else found among the imported modules."""
    if app.import_path:
        return app.import_path
    for name, module in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__"):
            continue
        for attribute, value in list(getattr(module, "__dict__", {}).items()):
            if value is app:
                return f"{name}:{attribute}"
    raise ConfigurationError("the process pool imports the App in each child process by its "
                             "module path: define it at the top level of an importable module "
                             "(not the __main__ script) and run `obsq worker MODULE:APP`")


def _start_context(app_path: str) -> ForkServerContext | SpawnContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["obsq.engine.pools.child", app_path.partition(":")[0]])
        return context
    return multiprocessing.get_context("spawn")


def _trace_carrier() -> dict[str, str]:
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier
