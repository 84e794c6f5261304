"""The first command a new user runs, and the private Redis it falls back on."""

from __future__ import annotations

import shutil
import subprocess
import sys

import redis
from support import missing_tool

from obsq.redis_server import EmbeddedRedis, start_private_redis


def test_the_demo_runs_tasks_and_shows_metrics(redis_url):
    result = subprocess.run(
        [sys.executable, "-m", "obsq", "demo", "--duration", "4", "--http-port", "0",
         "--redis-url", redis_url],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "metrics and probes on http://127.0.0.1:" in out
    for line in ("success  email:send", "retry    report:monthly", "success  report:monthly",
                 "dead     payment:charge", "obsq_tasks_processed_total{", "obsq_workers 1.0",
                 "Removed the demo's"):
        assert line in out, line
    leftovers = list(redis.Redis.from_url(redis_url).scan_iter(match="obsq-demo:*"))
    assert leftovers == [], "the demo left keys in the user's Redis"


def test_a_private_redis_server_starts_when_none_is_reachable():
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = start_private_redis()
    try:
        assert server.kind == "redis-server"
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.close()


def test_the_embedded_redis_serves_obsq_when_redis_server_is_missing():
    server = EmbeddedRedis()
    try:
        client = redis.Redis.from_url(server.url)
        assert client.info("server")["redis_version"].startswith("6.2")
        result = subprocess.run(
            [sys.executable, "-m", "obsq", "demo", "--duration", "3", "--http-port", "0",
             "--redis-url", server.url], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "dead     payment:charge" in result.stdout
    finally:
        server.close()
