"""Testing the shop's tasks with obsq.testing: a worker, the scheduler and the aggregator run
in the test's process against a private Redis, on a clock that moves only when the test
says. Each test runs hours or days of the shop's time in a fraction of a second."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import shop

from obsq.testing import Environment


def sent(kind: str) -> list[dict[str, Any]]:
    return [s for s in shop.sent if s["kind"] == kind]


async def test_the_welcome_email_is_retried_with_backoff_then_sent(obsq_env: Environment
                                                                   ) -> None:
    shop.mail_server["down_for"] = 2
    info = await obsq_env.client.enqueue("email:welcome", {"to": "ada@example.com"},
                                         retention=3600)
    await obsq_env.drain()  # the first attempt ran and failed; the retry waits for its backoff
    assert sent("welcome") == []
    assert (await obsq_env.client.info(info.id)).state == "retry"
    await obsq_env.advance(60)  # past both backoffs (1-2 s, then 2-4 s)
    assert sent("welcome") == [{"kind": "welcome", "to": "ada@example.com", "attempt": 2}]
    assert (await obsq_env.client.info(info.id)).state == "completed"


async def test_the_cart_reminder_goes_out_a_day_later(obsq_env: Environment) -> None:
    await obsq_env.client.enqueue("email:cart-reminder", {"to": "bob@example.com"},
                                  delay=timedelta(days=1).total_seconds())
    await obsq_env.advance(timedelta(days=1) - timedelta(seconds=1))
    assert sent("reminder") == []  # not a second early
    await obsq_env.advance(1)
    assert sent("reminder") == [{"kind": "reminder", "to": "bob@example.com"}]


async def test_a_payment_looks_again_every_ten_minutes_until_the_bank_clears_it(
        obsq_env: Environment) -> None:
    info = await obsq_env.client.enqueue("payment:capture", {"order": "A-1"}, retention=3600)
    await obsq_env.advance(1800)  # three more looks, each handed back for 10 minutes
    assert sent("receipt") == []
    shop.cleared.add("A-1")
    await obsq_env.advance(599)
    assert sent("receipt") == []  # the next look is not due yet
    await obsq_env.advance(1)
    assert sent("receipt") == [{"kind": "receipt", "order": "A-1"}]
    assert await obsq_env.client.result(info.id, timeout=1) == "captured"


@pytest.mark.obsq_app(shop.app, start=datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc))
async def test_the_nightly_report_fires_once_a_night_at_three_in_paris(obsq_env: Environment
                                                                       ) -> None:
    await obsq_env.advance(timedelta(days=7))
    assert [s["fire"] for s in sent("report")] == [  # 03:00 in Paris is 02:00 UTC in March
        f"report:nightly@2026-03-{day:02d}T02:00:00Z" for day in range(2, 9)]


async def test_page_views_are_counted_in_one_task_per_page_after_the_window(
        obsq_env: Environment) -> None:
    await obsq_env.client.enqueue("view:home", None, group="/home")
    await obsq_env.advance(5)
    await obsq_env.client.enqueue("view:home", None, group="/home")
    await obsq_env.advance(5)
    await obsq_env.client.enqueue("view:home", None, group="/home")
    await obsq_env.advance(9)
    assert sent("views") == []  # 9 s after the last view: its group still waits
    await obsq_env.advance(1)  # the grace period after the last view is over
    assert sent("views") == [{"kind": "views", "page": "/home", "count": 3}]
