"""Fixtures of the console tests: a real chromium driven by Playwright, and `obsq ui` run
as a subprocess, as an operator starts it. Under CI a missing browser fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ROOT, missing_tool

from obsq.redis_server import free_port

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        missing_tool("playwright is not installed (pip install --group test)")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        missing_tool("chromium is not installed (apt-get install chromium)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


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
