"""Django tasks that report what the worker did around them, for tests/test_django.py: the
state of their thread's database connection, the signals sent, an async task. The worker
finds them by the `django:` prefix (no installed app holds them)."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from django.dispatch import receiver
from orders.models import Order

try:
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
except ImportError:
    from django_tasks import task
    from django_tasks.signals import task_finished, task_started

STARTED: set[str] = set()
FINISHED: dict[str, str] = {}


@receiver(task_started)
def started(sender: type, task_result: Any, **kwargs: Any) -> None:
    STARTED.add(task_result.id)


@receiver(task_finished)
def finished(sender: type, task_result: Any, **kwargs: Any) -> None:
    FINISHED[task_result.id] = str(task_result.status)


@task
def left_open() -> bool:
    """Whether this thread's database connection was open as the task began; it leaves
    it open (a query) for whatever runs next on the thread."""
    was_open = connection.connection is not None
    Order.objects.exists()
    return was_open


@task
def keep_open_for(seconds: float) -> None:
    """Open this thread's connection and give it `seconds` to live, as CONN_MAX_AGE does
    (Django keeps the moment it becomes obsolete on the connection)."""
    Order.objects.exists()
    connection.close_at = time.monotonic() + seconds


@task(takes_context=True)
def signals_seen(context: Any) -> dict[str, Any]:
    return {"started": context.task_result.id in STARTED, "finished": dict(FINISHED)}


@task
async def add(a: int, b: int) -> int:
    return a + b
