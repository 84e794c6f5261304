"""Subprocess side of the benchmark: one worker or one producer of one system.

Protocol: the child writes `BENCH {json}` lines on stdout (`ready`, `go`, `mark`, `exit`,
`result`, `error`); a worker child takes `GO`, `MARK` and `STOP` lines on stdin (EOF = STOP).
Every redis-py `send_packed_command` call is counted: one call is one round trip
(a pipeline or a Lua script call is a single packed write)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import systems

_emit_lock = threading.Lock()


def emit(kind: str, **fields) -> None:
    line = "BENCH " + json.dumps({"kind": kind, **fields})
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def count_round_trips() -> None:
    """Wrap redis-py's send_packed_command (sync and asyncio) with a counter."""
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    async_orig = aconn.AbstractConnection.send_packed_command
    sync_orig = sconn.AbstractConnection.send_packed_command

    async def async_counting(self, command, check_health=True):
        systems.STATE.calls += 1
        return await async_orig(self, command, check_health)

    lock = threading.Lock()  # sync clients (dramatiq) call from many threads

    def sync_counting(self, command, check_health=True):
        with lock:
            systems.STATE.calls += 1
        return sync_orig(self, command, check_health)

    aconn.AbstractConnection.send_packed_command = async_counting
    sconn.AbstractConnection.send_packed_command = sync_counting


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def status() -> dict:
    return {
        "calls": systems.STATE.calls,
        "handled": systems.STATE.handled,
        "cpu": time.process_time(),
        "peak_rss_mb": peak_rss_mb(),
        "t": time.time(),
    }


class Control:
    """Reads GO / MARK / STOP from stdin in a thread."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.stopped = threading.Event()
        self._on_stop = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "GO":
                emit("go", **status())
                self.go.set()
            elif cmd == "MARK":
                emit("mark", **status())
            elif cmd == "STOP":
                break
        with self._lock:
            self.stopped.set()
            self.go.set()
            cb = self._on_stop
        if cb is not None:
            cb()

    def wait_go(self) -> bool:
        self.go.wait()
        return not self.stopped.is_set()

    def on_stop(self, cb) -> None:
        """Register the stop callback (called at once if STOP already came)."""
        with self._lock:
            self._on_stop = cb
            already = self.stopped.is_set()
        if already:
            cb()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=sorted(systems.SYSTEMS))
    p.add_argument("role", choices=["worker", "enqueue", "pickup", "ping"])
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--mode", choices=["single", "bulk", "sync", "concurrent", "async"],
                   default="single")
    p.add_argument("--task", choices=["noop", "io"], default="noop")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--tracing", action="store_true")
    p.add_argument("--http-port", type=int, default=0)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    system = systems.SYSTEMS[a.system]
    try:
        if a.role == "worker":
            count_round_trips()
            ctl = Control()
            system.worker(
                a.url, a.concurrency, ctl,
                ready=lambda: emit("ready", **status()),
                metrics=a.metrics, tracing=a.tracing, http_port=a.http_port,
            )
            emit(
                "exit",
                latencies=systems.STATE.latencies,
                tracing_exporter=systems.STATE.tracing_exporter, loop=systems.STATE.loop,
                **status(),
            )
        elif a.role == "enqueue":
            elapsed = system.enqueue(a.url, a.n, a.mode, a.task)
            emit("result", elapsed=elapsed, n=a.n)
        elif a.role == "ping":
            elapsed = systems.ping(a.url, a.n, a.mode)
            emit("result", elapsed=elapsed, n=a.n)
        else:
            elapsed = system.pickup(a.url, a.n, a.rate)
            emit("result", elapsed=elapsed, n=a.n)
    except BaseException:
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        emit("error", error=tb)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
