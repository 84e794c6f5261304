"""obsq's pytest plugin (the `obsq` entry point of group pytest11, loaded by pytest once obsq
is installed): the `obsq_env` fixture, an obsq.testing.Environment of your App for each test.

Say which App, either by overriding the `obsq_app` fixture (in a conftest.py, for every
test below it) or with a marker on a test, a class or a module (`pytestmark`), whose
keywords go to the Environment:

    @pytest.fixture
    def obsq_app() -> obsq.App:
        return myproject.tasks.app

    @pytest.mark.obsq_app(myproject.tasks.app, concurrency=4)
    async def test_signup_sends_the_welcome_email(obsq_env): ...

    @pytest.mark.obsq_app(myproject.tasks.app, schedules=False)  # no scheduler runs
    async def test_the_invoice_retries_until_the_bank_answers(obsq_env): ...

One private redis-server serves the whole session (`obsq_redis_url`; set OBSQ_TESTING_REDIS_URL
to use a Redis of your own), and each test gets a namespace of its own on it, removed at its
end, where the App runs as if it were its own. `obsq_env` is an async fixture: it needs
pytest-asyncio (or anyio's plugin).

pytest loads this module into every test run of a project that installs obsq: obsq.testing,
and with it the rest of obsq, is imported by the fixtures when a test asks for them, so a
run that uses none pays nothing for it (the package root imports nothing at import)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from obsq.app import App
    from obsq.testing import Environment

async_fixture: Callable[..., Any]  # pytest-asyncio's decorator, else pytest's own
try:
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # anyio's plugin runs plain async fixtures
    async_fixture = pytest.fixture


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "obsq_app(app, **options): the obsq.App that obsq_env "
                            "runs, and keywords for its obsq.testing.Environment")


@pytest.fixture(scope="session")
def obsq_redis_url() -> Iterator[str]:
    """The Redis the session's environments share: OBSQ_TESTING_REDIS_URL, else a private
    redis-server started at the first test that asks."""
    given = os.environ.get("OBSQ_TESTING_REDIS_URL")
    if given:
        yield given
        return
    from obsq.testing import private_redis

    server = private_redis()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def obsq_app(request: pytest.FixtureRequest) -> App:
    """The App under test: the obsq_app marker's, else override this fixture."""
    marker = request.node.get_closest_marker("obsq_app")
    if marker is None or not marker.args:
        raise pytest.UsageError(
            "obsq_env needs your App: define a fixture named obsq_app that returns it (in a "
            "conftest.py), or mark the test with @pytest.mark.obsq_app(app)")
    return marker.args[0]


@async_fixture
async def obsq_env(request: pytest.FixtureRequest, obsq_app: App, obsq_redis_url: str
                   ) -> AsyncIterator[Environment]:
    """A worker, scheduler and aggregator of obsq_app on a manual clock, in a namespace of
    the test's own."""
    marker = request.node.get_closest_marker("obsq_app")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    options.setdefault("namespace", f"t{uuid.uuid4().hex[:12]}")
    from obsq.testing import Environment

    async with Environment(obsq_app, redis_url=obsq_redis_url, **options) as env:
        yield env
