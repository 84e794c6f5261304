"""Tell obsq's pytest plugin which App the `obsq_env` fixture runs, and start each test with
the shop's state clean."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import shop

import obsq


@pytest.fixture
def obsq_app() -> obsq.App:
    return shop.app


@pytest.fixture(autouse=True)
def clean_shop() -> Iterator[None]:
    yield
    shop.sent.clear()
    shop.cleared.clear()
    shop.mail_server["down_for"] = 0
