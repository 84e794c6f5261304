"""The task tests/bench/django_commit.py measures with: how long after a moment it started."""

import time

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def started_after(moment: float) -> float:
    return time.time() - moment
