"""`obsq worker --processes N`: N worker processes in one pod, and one HTTP endpoint for
them all.

The supervisor starts each child as `python -m obsq worker APP --processes 1` with the
same settings (as OBSQ_* variables) and no HTTP endpoint of its own. The children write
their metrics to prometheus-client's multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`,
a temporary one if unset), which the supervisor cleans at start and serves, merged, with
the queue-wide gauges it reads from Redis on an event loop of its own. A child that dies
is restarted with backoff (its live gauges are dropped); a child that exits with a
configuration error (status 2) stops the whole pod with that status, as a single worker
would. /healthz: every child is running; /readyz: Redis answers. A child judges its own
liveness as a single worker's probe would (obsq/engine/liveness.py) and ends when it fails, so that
the supervisor starts another.

Stopping, as a single worker does: the first SIGTERM or SIGINT is one graceful drain in
every child, a second one means "stop now"; the supervisor then waits for their drain and
exits 0. The children run in a session of their own, so a signal to the supervisor's
process group (a terminal's Ctrl-C, `timeout`) reaches only the supervisor, which
forwards its first signal. They may still get the same signal as the supervisor
(systemd's KillMode=control-group signals every process of the unit, and so may an
operator), so a child does not count signals: any number of them is one drain
(`serve_supervised`). "Stop now" comes from the supervisor alone, as a byte on a pipe of
each child whose write end only the supervisor holds; the end of that pipe, when the
supervisor dies however it dies (SIGKILL too), drains the child, which would otherwise
outlive it in its own session.

Recycling (`--max-tasks-per-child`, `--max-memory-per-child`, without `--pool process`,
whose own children they limit instead): a child past its limits after a task drains, waiting
for each running handler to end (within its own timeout: none is handed back to run again;
a stop signal meanwhile makes it the usual drain), exits RECYCLED, and the supervisor starts
another at once, no backoff counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from obsq._version import __version__
from obsq.app import load_app
from obsq.background import on_stop_signals
from obsq.engine.liveness import LIVENESS, first_problem
from obsq.engine.recycling import Recycling
from obsq.settings import RESTART_MAX, RESTART_MIN, STABLE_AFTER, STOP_MARGIN, WorkerSettings

if TYPE_CHECKING:
    from obsq.app import CallNext
    from obsq.engine.worker import Worker
    from obsq.task import Task

log = logging.getLogger("obsq")

POLL = 0.2
CONFIG_ERROR = 2  # the exit status of `obsq` for a configuration error
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LIFELINE_FLAG = "--supervisor-fd"  # hidden `obsq worker` flag: the child's end of the pipe
STOP_NOW = b"!"  # written to the pipe of each child on the supervisor's second stop signal
CHILD_LIVENESS_CHECK = 5.0  # how often a child judges its own liveness
RECYCLED = 75  # the exit status of a child that drained past its limits (EX_TEMPFAIL)


class _Child:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.failures = 0
        self.restart_at: float | None = 0.0  # monotonic time of the next start; None: none
        self.restarts = 0
        self.signalled = False  # a stop signal was forwarded to this process
        self.lifeline: int | None = None  # the write end of its pipe

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(self, app_spec: str, settings: WorkerSettings) -> None:
        self.app_spec = app_spec
        self.settings = settings
        self.children = [_Child(i) for i in range(settings.processes)]
        self.queues: dict[str, int] = {}
        self._stopping = False
        self._wake = threading.Event()
        self._own_dir = False
        self._dir = ""
        self._http: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stop_watch: asyncio.Event | None = None
        self._watch: Any = None
        self._watching: Any = None

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        self._prepare_dir()
        app = load_app(self.app_spec)
        namespace = self.settings.namespace or app.namespace
        self.queues = self.settings.queues or dict.fromkeys(app.queues, 1)
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        status = 0
        try:
            if self.settings.http_port is not None:
                self._start_http(namespace, self.settings.http_port)
            log.info("supervisor %d: starting %d worker processes of %s%s", os.getpid(),
                     len(self.children), self.app_spec,
                     f", http on :{self._http.port}" if self._http else "")
            status = self._supervise()
        finally:
            self._stop_children()
            self._stop_http()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._own_dir:
                from obsq.observability.metrics import remove_multiprocess_dir

                remove_multiprocess_dir(self._dir)
        log.info("supervisor %d stopped", os.getpid())
        return status

    @property
    def port(self) -> int | None:
        return self._http.port if self._http else None

    def _prepare_dir(self) -> None:
        path = os.environ.get(MULTIPROC_ENV)
        if not path:
            path = tempfile.mkdtemp(prefix="obsq-metrics-")
            self._own_dir = True
        os.environ[MULTIPROC_ENV] = path  # before prometheus-client is imported here
        from obsq.observability.metrics import clear_multiprocess_dir

        clear_multiprocess_dir(path)
        self._dir = path

    def _on_signal(self, sig: int, frame: Any) -> None:
        name = signal.Signals(sig).name
        if self._stopping:
            log.info("received %s: stopping %d worker processes now", name, len(self.children))
            for child in self.children:
                if child.alive and child.lifeline is not None:
                    with contextlib.suppress(OSError):
                        os.write(child.lifeline, STOP_NOW)
            return
        log.info("received %s: stopping %d worker processes (a second signal stops them at "
                 "once, handing their running tasks back)", name, len(self.children))
        self._stopping = True
        for child in self.children:
            if child.alive:
                child.signalled = True
                with contextlib.suppress(OSError):
                    child.process.send_signal(sig)  # type: ignore[union-attr]
        self._wake.set()

    # -- children -------------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update({
            "OBSQ_REDIS_URL": s.redis_url,
            "OBSQ_CONCURRENCY": str(s.concurrency),
            "OBSQ_STRICT_PRIORITY": "true" if s.strict_priority else "false",
            "OBSQ_SHUTDOWN_TIMEOUT": repr(float(s.shutdown_timeout)),
            "OBSQ_LEASE_SECONDS": repr(float(s.lease_seconds)),
            "OBSQ_PRIORITY_AGING": repr(float(s.priority_aging)),
            "OBSQ_MAX_RECOVERIES": str(s.max_recoveries),
            "OBSQ_METRICS": "true" if s.metrics else "false",
            "OBSQ_QUEUE_METRICS": "true" if s.queue_metrics else "false",
            "OBSQ_TRACING": "true" if s.tracing else "false",
            "OBSQ_ALLOW_EVICTION": "true" if s.allow_eviction else "false",
            "OBSQ_LOG_FORMAT": s.log_format,
            "OBSQ_LOG_LEVEL": str(s.log_level),
            "OBSQ_PROCESSES": "1",
            "OBSQ_POOL": s.pool,
            "OBSQ_LOOP": s.loop,
            "OBSQ_STUCK_LIMIT": repr(float(s.stuck_limit)),
            "OBSQ_MAX_TASKS_PER_CHILD": str(s.max_tasks_per_child),
            "OBSQ_MAX_MEMORY_PER_CHILD": str(s.max_memory_per_child),
            "OBSQ_HTTP_PORT": "-1",  # the supervisor serves the pod's endpoint
            MULTIPROC_ENV: self._dir,
        })
        if s.namespace:
            env["OBSQ_NAMESPACE"] = s.namespace
        if s.route_concurrency:  # the flag's, which wins over an inherited variable
            env["OBSQ_ROUTE_CONCURRENCY"] = ",".join(
                f"{pattern}={n}" for pattern, n in s.route_concurrency.items())
        if s.queues:  # else each child serves its App's queues, as a single worker does
            env["OBSQ_QUEUES"] = ",".join(f"{q}={w}" for q, w in s.queues.items())
        return env

    def _spawn(self, child: _Child) -> None:
        self._close_lifeline(child)  # a restarted child's old pipe
        read, child.lifeline = os.pipe()
        child.signalled = False
        try:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "obsq", "worker", self.app_spec, "--processes", "1",
                 LIFELINE_FLAG, str(read)],
                env=self._child_env(), start_new_session=True, pass_fds=(read,))
        finally:
            os.close(read)
        child.started = time.monotonic()
        child.restart_at = None
        log.info("worker process %d started: pid %d", child.index, child.process.pid)

    def _supervise(self) -> int:
        from prometheus_client.multiprocess import mark_process_dead

        while not self._stopping:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self._spawn(child)
                    continue
                process = child.process
                if process is None or process.poll() is None:
                    continue
                code = process.returncode
                mark_process_dead(process.pid, self._dir)
                if code == RECYCLED:
                    log.info("worker process %d (pid %d) drained past its limits; starting "
                             "its replacement", child.index, process.pid)
                    child.restart_at = now
                    child.restarts += 1
                    continue
                if code == CONFIG_ERROR and now - child.started < STABLE_AFTER:
                    log.error("worker process %d (pid %d) stopped with a configuration "
                              "error; stopping", child.index, process.pid)
                    self._stopping = True
                    return CONFIG_ERROR
                child.failures = 1 if now - child.started >= STABLE_AFTER else \
                    child.failures + 1
                delay = min(RESTART_MIN * 2 ** (child.failures - 1), RESTART_MAX)
                child.restart_at = now + delay
                child.restarts += 1
                log.warning("worker process %d (pid %d) exited with %s; restarting it in "
                            "%.0f s", child.index, process.pid, _describe_exit(code), delay)
            self._wake.wait(POLL)
            self._wake.clear()
        return 0

    def _stop_children(self) -> None:
        from prometheus_client.multiprocess import mark_process_dead

        running = [c.process for c in self.children if c.alive]
        for child in self.children:  # those a forwarded signal has not stopped already
            if child.alive and not child.signalled:
                child.signalled = True
                with contextlib.suppress(OSError):
                    child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + self.settings.shutdown_timeout + STOP_MARGIN
        for process in running:
            if process is None:
                continue
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.error("worker process pid %d did not stop in time; killing it",
                          process.pid)
                process.kill()
                process.wait()
        for child in self.children:
            self._close_lifeline(child)
            if child.process is not None:
                mark_process_dead(child.process.pid, self._dir)

    @staticmethod
    def _close_lifeline(child: _Child) -> None:
        fd, child.lifeline = child.lifeline, None  # first: a signal handler may write to it
        if fd is not None:
            os.close(fd)

    # -- the pod's HTTP endpoint ----------------------------------------------------------

    def _start_http(self, namespace: str, port: int) -> None:
        from obsq.broker import Broker
        from obsq.observability.collector import QueueCollector
        from obsq.observability.http import HealthServer
        from obsq.observability.metrics import endpoint_registry
        from obsq.observability.probes import RedisWatch

        loop = self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=loop.run_forever, name="obsq-supervisor",
                                             daemon=True)
        self._loop_thread.start()
        broker = Broker(self.settings.redis_url, namespace)
        self._watch = RedisWatch(broker)

        self._watching = asyncio.run_coroutine_threadsafe(self._run_watch(), loop)
        collectors = [QueueCollector(broker, loop, list(self.queues))
                      ] if self.settings.queue_metrics else []
        registry = endpoint_registry(*collectors)
        self._http = HealthServer(self.settings.http_host, port, registry,
                                  live=self._live, ready=self._ready, status=self._status)

    async def _run_watch(self) -> None:
        self._stop_watch = asyncio.Event()
        await self._watch.run(self._stop_watch)

    def _live(self) -> str | None:
        down = [c.index for c in self.children if not c.alive]
        return f"worker processes {down} are not running" if down else None

    def _ready(self) -> str | None:
        if self._stopping:
            return "stopping"
        return self._watch.problem()

    def _status(self) -> dict[str, Any]:
        return {"supervisor": os.getpid(), "version": __version__,
                "queues": self.queues, "concurrency": self.settings.concurrency,
                "processes": [{"index": c.index, "pid": c.process.pid if c.process else None,
                               "alive": c.alive, "restarts": c.restarts}
                              for c in self.children]}

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        loop = self._loop
        if loop is None:
            return

        if self._stop_watch is not None:
            loop.call_soon_threadsafe(self._stop_watch.set)
        with contextlib.suppress(Exception):
            self._watching.result(5)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._watch.broker.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=5)
        loop.close()
        self._loop = None


class Recycler:
    """A child's count of the handlers it ran: past its limits, it drains (`reason` set), to
    exit RECYCLED. The outermost middleware, so the drain begins as the handler returns,
    before the fetch that carries its end takes another task."""

    def __init__(self, worker: Worker, recycling: Recycling) -> None:
        self.worker = worker
        self.recycling = recycling
        self.tasks = 0
        self.reason: str | None = None

    async def __call__(self, task: Task, call_next: CallNext) -> Any:
        try:
            return await call_next(task)
        finally:
            self.tasks += 1
            reason = self.recycling.spent(self.tasks) if self.reason is None else None
            if reason is not None:
                self.reason = reason
                log.info("worker %s drains, to be replaced %s", self.worker.id,
                         self.recycling.said(reason, self.tasks))
                self.worker.app.recycle_hooks(reason)
                self.worker.stop(patient=True)  # the other running tasks end as they would


def serve_supervised(worker: Worker, fd: int) -> Recycler | None:
    """In a child, on its event loop, for a Worker that does not handle signals itself: any
    number of SIGTERM and SIGINT is one drain; a byte on the pipe `fd` (the supervisor's
    second signal) stops now; its end of file (the supervisor is gone) drains. Its Recycler
    when it has limits of its own (its handlers not in a process pool, which has them)."""
    loop = asyncio.get_running_loop()

    def drain(why: str) -> None:
        if not worker.draining or worker.waiting_patiently:
            log.info("%s: draining", why)
            worker.stop()

    def from_supervisor() -> None:
        if os.read(fd, 1):
            log.info("the supervisor says: stop now")
            worker.stop(now=True)
        else:
            loop.remove_reader(fd)
            drain(f"the supervisor of worker {worker.id} is gone")

    on_stop_signals(lambda sig: drain(f"received {sig.name}"))
    loop.add_reader(fd, from_supervisor)
    threading.Thread(target=_end_when_not_alive, args=(worker,), name="obsq-liveness",
                     daemon=True).start()
    s = worker.settings
    recycling = Recycling(s.max_tasks_per_child, s.max_memory_per_child)
    if not recycling or s.pool == "process":
        return None
    recycler = Recycler(worker, recycling)
    worker.app.middleware.insert(0, recycler)
    return recycler


def _end_when_not_alive(worker: Worker) -> None:
    """A child has no probe of its own, and the pod's /healthz sees only that it runs: what
    fails a single worker's liveness (its event loop blocked past the limit, its heartbeat
    thread dead, a slot stuck past the limit) ends the child, and the supervisor starts
    another, as Kubernetes restarts a pod. Its tasks run again once its heartbeat lapses."""
    while True:
        time.sleep(CHILD_LIVENESS_CHECK)
        problem = first_problem(worker.health(), LIVENESS)
        if problem is not None and not worker.draining:  # a drain ends by its own deadline
            log.error("worker %s: %s; this process ends, and the supervisor starts another",
                      worker.id, problem)
            os._exit(1)


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"
