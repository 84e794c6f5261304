"""Parent-side helpers for the benchmark: private redis-servers, worker subprocesses,
an OTLP/HTTP sink and small statistics helpers. Standard library plus redis-py only."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
CHILD = HERE / "child.py"
REPO = HERE.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version_of(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else ()


def find_redis_server(explicit: str | None = None) -> tuple[str, str]:
    """The newest `redis-server` on PATH (PATH may hold an old embedded one first)."""
    if explicit:
        v = _version_of(explicit)
        if not v:
            raise SystemExit(f"{explicit} is not a usable redis-server")
        return explicit, ".".join(map(str, v))
    seen: dict[str, tuple[int, ...]] = {}
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(d, "redis-server")
        if os.access(cand, os.X_OK) and cand not in seen:
            seen[cand] = _version_of(cand)
    seen = {k: v for k, v in seen.items() if v}
    if not seen:
        raise SystemExit("no redis-server on PATH")
    best = max(seen, key=lambda k: seen[k])
    return best, ".".join(map(str, seen[best]))


class RedisServer:
    """A private, persistence-free redis-server on a free loopback port."""

    def __init__(self, binary: str):
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.client: redis.Redis | None = None

    def __enter__(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError as e:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from e
                time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cpu_seconds(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def commands_processed(self) -> int:
        return int(self.client.info("stats")["total_commands_processed"])

    def flush(self) -> None:
        self.client.flushall()


class ChildError(RuntimeError):
    pass


def first_on_path(directory: Path) -> str:
    """A child's PYTHONPATH: `directory` first (the obsq it runs), then the bench's own."""
    return os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p)


class Child:
    """A `child.py` subprocess speaking the line protocol: it writes `BENCH {json}` lines to
    stdout and takes GO / MARK / STOP commands on stdin."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, label: str = "",
                 obsq_from: Path = REPO):
        """`obsq_from`: the directory first on the child's path, the checkout's or the one
        compare.py installed a baseline into."""
        self.label = label or " ".join(args[:2])
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = first_on_path(obsq_from)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            text=True, env=full_env, cwd=str(REPO),
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                self._lines.put(line[6:])
            else:
                sys.stderr.write(f"[{self.label}] {line}")
        self._lines.put(None)

    def tail(self, n: int = 40) -> str:
        self.stderr.seek(0)
        return "".join(self.stderr.readlines()[-n:])

    def expect(self, kind: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildError(f"{self.label}: no {kind} within {timeout}s\n{self.tail()}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise ChildError(
                    f"{self.label}: exited ({self.proc.returncode}) before {kind}\n{self.tail()}"
                )
            msg = json.loads(line)
            if msg.get("kind") == "error":
                raise ChildError(f"{self.label}: {msg.get('error')}\n{self.tail()}")
            if msg.get("kind") == kind:
                return msg

    def check_alive(self) -> None:
        """Raise ChildError (with the child's own error, if it sent one) if it has exited."""
        if self.proc.poll() is None:
            return
        errors = []
        while True:
            try:
                line = self._lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            msg = json.loads(line)
            if msg.get("kind") == "error":
                errors.append(msg.get("error", ""))
        detail = "\n".join(errors) or self.tail()
        raise ChildError(f"{self.label}: exited ({self.proc.returncode})\n{detail}")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def finish(self, timeout: float = 60) -> dict:
        """Ask the child to stop, return its final `exit` record."""
        self.send("STOP")
        try:
            msg = self.expect("exit", timeout)
        finally:
            self.close()
        return msg

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def run_child(args: list[str], timeout: float = 300, label: str = "", **how) -> dict:
    """Run a one-shot child (a producer) and return its `result` record; `how`: Child's
    `env` and `obsq_from`."""
    c = Child(args, label=label, **how)
    try:
        return c.expect("result", timeout)
    finally:
        c.close()


def cpu_of(pid: int) -> float:
    """utime + stime of a process in seconds (from /proc, clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class PySpy:
    """py-spy attached to a running process; writes its flame graph on stop() (its
    collapsed stacks, one line each, to a path ending in .txt)."""

    def __init__(self, pid: int, out: str):
        exe = shutil.which("py-spy")
        if not exe:
            raise SystemExit("py-spy is not installed (pip install py-spy)")
        self.out = out
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "-o", out, "--format",
             "raw" if out.endswith(".txt") else "flamegraph", "--nonblocking", "--rate", "250"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(1.0)  # let it attach before the clock starts
        if self.proc.poll() is not None:
            raise SystemExit(f"py-spy failed: {self.proc.stderr.read()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class OtlpSink:
    """A minimal OTLP/HTTP receiver: accepts POST /v1/{traces,metrics,logs}, answers 200."""

    port: int = 0
    requests: int = 0
    bytes: int = 0
    _server: http.server.ThreadingHTTPServer | None = field(default=None, repr=False)
    _bodies: list[bytes] = field(default_factory=list, repr=False)

    @property
    def spans(self) -> int | None:
        """Spans received, decoded after the fact (None without opentelemetry-proto)."""
        try:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceRequest,
            )
        except ImportError:
            return None
        n = 0
        for body in self._bodies:
            req = ExportTraceServiceRequest.FromString(body)
            n += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        return n

    def __enter__(self) -> OtlpSink:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.path.startswith("/v1/"):
                    sink.requests += 1
                    sink.bytes += len(body)
                    if self.path == "/v1/traces":
                        sink._bodies.append(body)
                    code = 200
                else:
                    code = 404
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def env(self) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_SERVICE_NAME": "obsq-bench",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        }


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]
