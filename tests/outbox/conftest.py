"""Fixtures of the outbox's tests: a private PostgreSQL cluster (one per xdist worker,
tests/outbox/postgres.py) and a SQLite file, each test with an outbox table of its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import missing_tool

from outbox.postgres import PostgresCluster, postgres_bin


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if postgres_bin("initdb") is None:
        missing_tool("no initdb: apt-get install postgresql")
    cluster = PostgresCluster().start()
    yield cluster.url
    cluster.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'app.db'}"


@pytest.fixture(params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test twice: on PostgreSQL (LISTEN/NOTIFY, the lead lock) and on SQLite (polling)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def table_name() -> str:
    return f"outbox_{uuid.uuid4().hex[:12]}"
