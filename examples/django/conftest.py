"""Django set up for the shop's tests, on a database of their own, and the fixtures that run
its tasks with obsq.testing: `obsq_app` is the worker's App (obsq's pytest plugin runs it
in each test's `obsq_env`), and `tasks` points the backend at that environment."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import django
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

import obsq
import obsq.django
from obsq.testing import Environment

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
os.environ.setdefault("SHOP_DATABASE", os.path.join(tempfile.mkdtemp(), "shop.sqlite3"))
django.setup()


@pytest.fixture(scope="session", autouse=True)
def database() -> None:
    call_command("migrate", run_syncdb=True, verbosity=0)


@pytest.fixture
def obsq_app() -> obsq.App:
    return obsq.django.app


@pytest.fixture
def tasks(obsq_env: Environment) -> Iterator[Environment]:
    """The environment, with every backend of TASKS enqueueing into it."""
    into_env = {"redis_url": obsq_env.redis_url, "namespace": obsq_env.namespace}
    backends = {alias: {**backend, "OPTIONS": {**backend.get("OPTIONS", {}), **into_env}}
                for alias, backend in settings.TASKS.items()}
    with override_settings(TASKS=backends):
        yield obsq_env
