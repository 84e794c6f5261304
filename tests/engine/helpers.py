"""Helpers shared by the engine tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from obsq.broker import Broker

ROOT = Path(__file__).resolve().parents[2]


def namespace_keys(r: Any, namespace: str) -> list[bytes]:
    """Every key of a namespace (a sync redis-py client)."""
    return list(r.scan_iter(match=f"{namespace}:*", count=1000))


async def live_worker_pids(broker: Broker) -> set[int]:
    return {w["pid"] for w in await broker.workers()}


def record_key(namespace: str, name: str) -> str:
    """A key written by the handlers of tests/engine/apps.py."""
    return f"{namespace}:rec:{name}"


def decoded(values: list[bytes]) -> list[str]:
    return [v.decode() for v in values]


class WorkerProcess:
    """One `obsq worker` subprocess; its output goes to a log file, shown on failure."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT)

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

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


def clients_running(r: Any, command: str) -> int:
    """How many connections are inside `command` now (e.g. blocked in BRPOP)."""
    return sum(1 for c in r.client_list() if c.get("cmd") == command
               and "b" in c.get("flags", ""))
