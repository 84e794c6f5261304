"""Fixtures of the console tests: `obsq ui` run as a subprocess, as an operator starts it
(the browser, a real chromium, is tests/conftest.py's `browser`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from support import ROOT

from obsq.redis_server import free_port


@pytest.fixture
def console_process(redis_url: str, namespace: str, tmp_path: Path
                    ) -> Iterator[Callable[..., str]]:
    """`url = start("--token", T)`: `obsq ui` on a free port of 127.0.0.1, stopped at the
    end of the test; its log is printed (shown on failure)."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*extra: str) -> str:
        port = free_port()
        log = tmp_path / f"console-{port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OBSQ_")}
        process = subprocess.Popen(
            [sys.executable, "-m", "obsq", "ui", "--redis-url", redis_url, "--namespace",
             namespace, "--http-port", str(port), *extra],
            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        started.append((process, log))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"obsq ui exited: {log.read_text()}")
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"obsq ui did not become ready: {log.read_text()}")

    yield start
    for process, log in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(f"--- obsq ui log ---\n{log.read_text()}")
