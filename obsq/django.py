"""Django's task API on obsq: `ObsqBackend` turns a Django task (`django.tasks`, Django 6 and
later; the `django-tasks` backport on Django 5) into an obsq task of type
`django:<module path>`, and `obsq worker obsq.django:app` runs it. Being an obsq task like
any other, it has the worker's metrics, traces, retries and console.

    TASKS = {"default": {"BACKEND": "obsq.django.ObsqBackend", "QUEUES": ["default"],
                         "OPTIONS": {"redis_url": "redis://redis:6379/0", "namespace": "shop"}}}

In the file: the names of either API, how Django's task options become obsq's (priority,
queue, run_after) and obsq's states Django's statuses, the backend a web process enqueues
and reads results through, the handler that runs one Django task as Django's own workers
do (database connections closed or kept per task, the task_started and task_finished
signals), and the App `obsq worker` loads.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

import django
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import close_old_connections, connections
from django.dispatch import receiver
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules, import_string

import obsq.errors
from obsq.app import App, Hooks
from obsq.errors import SkipRetry, StartupError, TaskNotFound
from obsq.inspection.inspected import TaskDetail
from obsq.inspection.inspector import Inspector
from obsq.names import check_seconds, validate_namespace
from obsq.producer.enqueue import JobChecks
from obsq.producer.sync_client import SyncClient
from obsq.settings import DEFAULT_NAMESPACE, DEFAULT_REDIS_URL
from obsq.task import Job
from obsq.task import Task as ObsqTask

try:  # Django 6 and later
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5 with the django-tasks package
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = ["TYPE_PREFIX", "ObsqBackend", "app", "obsq_priority"]

TYPE_PREFIX = "django:"  # a Django task's obsq type: the prefix, then its module path
# A Django task that raises has failed (Django's API has no retries): none unless OPTIONS
# give max_retry. Its result is kept a day (OPTIONS' retention), as a task's progress is.
DEFAULT_MAX_RETRY = 0
DEFAULT_RETENTION = 24 * 3600.0
OPTION_NAMES = ("redis_url", "namespace", "retention", "max_retry", "timeout", "outbox",
                "outbox_table")
# the process running a task, as the TaskResult's worker_ids name the current attempt's
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"

# obsq's states as Django's statuses: waiting (to start, for its time, for its retry) is
# READY; a cancelled task ended without its result, as a failed one does
STATUS_OF_STATE = {
    "pending": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "retry": TaskResultStatus.READY,
    "aggregating": TaskResultStatus.READY,
    "active": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
RAN_STATES = ("active", "completed", "dead")  # an attempt runs or ran without a retry after it

T = TypeVar("T")
app: App  # the worker's App, made at its first use (__getattr__, at the end of the file)


def obsq_priority(django_priority: int) -> int:
    """Django's -100..100 onto obsq's 0..9 in bands of 20, higher first in both: -100..-81
    is 0, -1 is 4, Django's default 0 is 5, 80..100 is 9."""
    return min((django_priority + 100) // 20, 9)


class ObsqBackend(BaseTaskBackend):
    """A task backend whose tasks an obsq worker runs (`obsq worker obsq.django:app`).

    OPTIONS: `redis_url` (else OBSQ_REDIS_URL), `namespace` (else OBSQ_NAMESPACE),
    `retention` (seconds a result is kept, a day by default), `max_retry` (retries of a task
    that raises, 0 by default as Django's API has none), `timeout` (seconds a task may run,
    obsq's default of 1800 otherwise), `outbox` (the alias of a database of DATABASES: each
    task is written as a row of that database's outbox table, `outbox_table`, obsq_outbox
    by default, in the transaction the enqueue runs in, and `obsq outbox` moves it to Redis
    once committed; without it a task goes to Redis at once)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, object]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTION_NAMES))
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] of obsq.django.ObsqBackend "
                                       f"has no {', '.join(unknown)}: it takes "
                                       f"{', '.join(OPTION_NAMES)}")
        self.redis_url: str = (self.options.get("redis_url") or os.environ.get("OBSQ_REDIS_URL")
                               or DEFAULT_REDIS_URL)
        self.namespace = validate_namespace(self.options.get("namespace") or os.environ.get(
            "OBSQ_NAMESPACE") or DEFAULT_NAMESPACE)
        self.retention: float = self.options.get("retention", DEFAULT_RETENTION)
        check_seconds("retention", self.retention)
        self.max_retry: int = self.options.get("max_retry", DEFAULT_MAX_RETRY)
        if isinstance(self.max_retry, bool) or not isinstance(self.max_retry, int) \
                or self.max_retry < 0:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['max_retry'] must be a "
                                       f"whole number of retries, got {self.max_retry!r}")
        self.timeout: float | None = self.options.get("timeout")
        if self.timeout is not None:
            check_seconds("timeout", self.timeout)
        self.outbox: str | None = self.options.get("outbox")
        if self.outbox is not None and self.outbox not in settings.DATABASES:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['outbox'] names the "
                                       f"database its tasks are written to: {self.outbox!r} "
                                       f"is none of DATABASES ({', '.join(settings.DATABASES)})")
        self.outbox_table: str | None = self.options.get("outbox_table")  # None: obsq's
        self._checks = JobChecks(None, Hooks("refusal hook"))  # an outbox row's, at enqueue

    def enqueue(self, task: Task, args: Sequence[object], kwargs: Mapping[str, object]
                ) -> TaskResult:
        self.validate_task(task)
        # made first: it checks that the arguments are JSON, before anything is written
        result = TaskResult(task=task, id="", status=TaskResultStatus.READY,
                            enqueued_at=timezone.now(), started_at=None, finished_at=None,
                            last_attempted_at=None, args=args, kwargs=kwargs,
                            backend=self.alias, errors=[], worker_ids=[])
        call: dict[str, object] = {"args": result.args, "kwargs": result.kwargs,
                                   "priority": task.priority, "backend": self.alias}
        if task.run_after is not None:
            call["run_after"] = task.run_after.isoformat()
        job = Job(TYPE_PREFIX + task.module_path, call, queue=task.queue_name,
                  priority=obsq_priority(task.priority), eta=task.run_after,
                  retention=self.retention, max_retry=self.max_retry, timeout=self.timeout)
        if self.outbox is None:
            task_id = _shared(_clients, SyncClient, self.redis_url,
                              self.namespace).enqueue_many([job])[0].id
        else:
            task_id = self._write_row(job)
        object.__setattr__(result, "id", task_id)  # as Django's backends set their results'
        task_enqueued.send(type(self), task_result=result)
        return result

    def _write_row(self, job: Job) -> str:
        """The task as a row of the outbox table, through the outbox database's connection:
        in the transaction the enqueue runs in (`transaction.atomic`), committed or rolled
        back with it (obsq.outbox's row; on PostgreSQL the relay is notified at the commit)."""
        from obsq.outbox.table import DEFAULT_TABLE, row_of  # obsq[outbox]: SQLAlchemy

        now = time.time()
        message = self._checks.prepare([job], now)[0]
        row = row_of(message, now)
        connection = connections[self.outbox]
        name = self.outbox_table or DEFAULT_TABLE
        table = connection.ops.quote_name(name)
        columns = ", ".join(map(connection.ops.quote_name, row))  # the row's, as row_of made it
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES "
                           f"({', '.join(['%s'] * len(row))})", list(row.values()))
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_notify(%s, '')", [name])
        return message.id

    def get_result(self, result_id: str) -> TaskResult:
        """The task as Redis keeps it; TaskResultDoesNotExist once it is gone (its retention
        ran out) or when it is no Django task."""
        try:
            detail = _shared(_readers, _Reads, self.redis_url, self.namespace).task(result_id)
        except (TaskNotFound, ValueError):  # ValueError: no id a task can have
            raise TaskResultDoesNotExist(result_id) from None
        if not detail.type.startswith(TYPE_PREFIX) or not isinstance(detail.payload, dict):
            raise TaskResultDoesNotExist(result_id)
        return _result_of(detail)


# -- a task's record in Redis, as Django's TaskResult -------------------------------------------

def _result_of(detail: TaskDetail) -> TaskResult:
    call = detail.payload
    attempts = detail.retry_count + (detail.state in RAN_STATES)
    worker_ids = [""] * attempts  # obsq knows the worker of the running attempt alone
    if detail.state == "active" and detail.worker and worker_ids:
        worker_ids[-1] = detail.worker
    errors = []
    if detail.error:
        errors.append(TaskError(exception_class_path=_class_path(detail.error, detail.traceback),
                                traceback=detail.traceback or detail.error))
    elif detail.state == "cancelled":
        errors.append(TaskError(exception_class_path="obsq.errors.TaskCancelled",
                                traceback="obsq.errors.TaskCancelled: the task was cancelled"))
    result = TaskResult(
        task=_as_enqueued(detail.type, call, detail.queue), id=detail.id,
        status=STATUS_OF_STATE.get(detail.state, TaskResultStatus.READY),
        enqueued_at=_django_time(detail.enqueued_at), started_at=None,
        finished_at=_django_time(detail.completed_at) if detail.state in (
            "completed", "dead", "cancelled") else None,
        last_attempted_at=None, args=call.get("args", []), kwargs=call.get("kwargs", {}),
        backend=call.get("backend", ""), errors=errors, worker_ids=worker_ids)
    if detail.state == "completed":
        object.__setattr__(result, "_return_value", detail.result)  # as Django's backends do
    return result


def _class_path(error: str, trace: str | None) -> str:
    """The class of a task's error as Django names it (`module.QualName`). obsq keeps the
    class's name in the error, and the traceback's line of the exception names it with its
    module (Python leaves the module out for a builtin, and obsq's own errors may have no
    traceback)."""
    name = error.partition(":")[0]
    named = re.compile(rf"((?:[\w.]+\.)?{re.escape(name)})(?::|$)")
    for line in reversed((trace or "").splitlines()):
        found = named.match(line)
        if found and "." in found[1]:
            return found[1]
    if hasattr(builtins, name):
        return f"builtins.{name}"
    return f"obsq.errors.{name}" if hasattr(obsq.errors, name) else name


def _django_time(moment: datetime | None) -> datetime | None:
    """An aware time as Django's settings want it: aware with USE_TZ, else naive local."""
    if moment is None or settings.USE_TZ:
        return moment
    return timezone.make_naive(moment)


def _as_enqueued(task_type: str, call: Mapping[str, Any], queue: str) -> Task:
    """The Django task as it was enqueued: the one at its module path, with the options the
    enqueue gave it."""
    module_path = task_type[len(TYPE_PREFIX):]
    found = import_string(module_path)
    if not isinstance(found, Task):
        raise SkipRetry(f"{module_path} is not a Django task (a function decorated with @task)")
    run_after = call.get("run_after")
    return replace(found, queue_name=queue, priority=call.get("priority", found.priority),
                   backend=call.get("backend", found.backend),
                   run_after=datetime.fromisoformat(run_after) if run_after else None)


# -- the clients a process shares --------------------------------------------------------------

class _Reads:
    """An Inspector on an event loop of its own thread: Django reads results from sync code,
    and every read of the Inspector is a coroutine."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="obsq-django-results",
                         daemon=True).start()
        self._inspector = self._run(_inspector(redis_url, namespace))

    def task(self, task_id: str) -> TaskDetail:
        return self._run(self._inspector.task(task_id))

    def close(self) -> None:
        self._run(self._inspector.close())
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()


async def _inspector(redis_url: str, namespace: str) -> Inspector:
    return Inspector(redis_url, namespace)  # made on the loop that will run its calls


# Django makes a backend per thread (and anew when TASKS changes): the Redis clients are the
# process's, one per Redis and namespace, made at their first use.
_clients: dict[tuple[str, str], SyncClient] = {}
_readers: dict[tuple[str, str], _Reads] = {}
_made = threading.Lock()


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: object) -> None:
    """TASKS changed (a test's override_settings): the clients made for the settings before
    are closed, not left open for the rest of the process."""
    if setting == "TASKS":
        with _made:
            for made in (_clients, _readers):
                for client in made.values():
                    client.close()
                made.clear()


def _shared(made: dict[tuple[str, str], T], kind: Callable[[str, str], T], redis_url: str,
            namespace: str) -> T:
    key = (redis_url, namespace)
    if key not in made:
        with _made:
            if key not in made:
                made[key] = kind(redis_url, namespace)
    return made[key]


# -- the worker's side ----------------------------------------------------------------------

def run_django_task(task: ObsqTask) -> object:
    """Run the Django task an obsq task carries, as Django's own workers do: database
    connections that are unusable or past CONN_MAX_AGE are closed before and after it (the
    worker's threads outlive their tasks, as a web server's outlive their requests), and
    task_started and task_finished are sent around it. A task that raises fails with the
    same error (retried when OPTIONS give max_retry); its return value is its result."""
    call = task.payload
    django_task = _as_enqueued(task.type, call, task.queue)
    now = timezone.now()
    result = TaskResult(task=django_task, id=task.id, status=TaskResultStatus.RUNNING,
                        enqueued_at=None, started_at=now, last_attempted_at=now,
                        finished_at=None, args=call["args"], kwargs=call["kwargs"],
                        backend=django_task.backend, errors=[],
                        worker_ids=[""] * task.retry_count + [WORKER_NAME])
    args = [TaskContext(task_result=result), *result.args] if django_task.takes_context \
        else result.args
    close_old_connections()
    try:
        task_started.send(type(django_task.get_backend()), task_result=result)
        try:
            value = normalize_json(django_task.call(*args, **result.kwargs))
        except BaseException as exc:
            error = TaskError(exception_class_path=f"{type(exc).__module__}."
                                                   f"{type(exc).__qualname__}",
                              traceback="".join(traceback.format_exception(
                                  type(exc), exc, exc.__traceback__)))
            result.errors.append(error)
            _finished(result, TaskResultStatus.FAILED)  # in the handler: its logger's exc_info
            raise
        object.__setattr__(result, "_return_value", value)
        _finished(result, TaskResultStatus.SUCCESSFUL)
        return value
    finally:
        close_old_connections()


def _finished(result: TaskResult, status: TaskResultStatus) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send(type(result.task.get_backend()), task_result=result)


def _worker_app() -> App:
    """The App of `obsq worker obsq.django:app`: Django set up from DJANGO_SETTINGS_MODULE,
    the handler of every `django:` type in the namespace of the TASKS backends that are
    ObsqBackends, their QUEUES served. The `tasks` modules of the installed apps are
    imported (as Celery's autodiscovery does), and each Django task found there gets a route
    of its own: its type, not only `django:`, labels its metrics."""
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise StartupError("obsq.django:app needs Django's settings: set "
                           "DJANGO_SETTINGS_MODULE (as for manage.py)")
    try:
        django.setup()
        backends = [b for b in task_backends.all() if isinstance(b, ObsqBackend)]
    except (ImproperlyConfigured, ImportError) as exc:
        raise StartupError(f"obsq.django:app: Django's settings: {exc}") from None
    if not backends:
        raise StartupError("obsq.django:app: no backend of settings.TASKS is "
                           "obsq.django.ObsqBackend")
    namespaces = sorted({b.namespace for b in backends})
    if len(namespaces) > 1:
        raise StartupError(f"obsq.django:app serves one namespace; the ObsqBackends of "
                           f"settings.TASKS name {', '.join(namespaces)}")
    worker_app = App(namespace=namespaces[0])
    for queue in sorted(set().union(*(b.queues for b in backends))):
        worker_app.queue(queue)
    worker_app.task(TYPE_PREFIX)(run_django_task)
    for module_path in sorted(_discovered({b.alias for b in backends})):
        worker_app.task(TYPE_PREFIX + module_path)(run_django_task)
    return worker_app


def _discovered(aliases: set[str]) -> set[str]:
    """The module paths of the Django tasks of `aliases` in the installed apps' tasks
    modules."""
    autodiscover_modules("tasks")
    found = set()
    for config in apps.get_app_configs():
        module = sys.modules.get(f"{config.name}.tasks")
        for value in vars(module).values() if module is not None else ():
            if isinstance(value, Task) and value.backend in aliases:
                found.add(value.module_path)
    return found


def __getattr__(name: str) -> App:
    """`app`, made at its first use: a web process that only enqueues never builds it."""
    if name != "app":
        raise AttributeError(f"module 'obsq.django' has no attribute {name!r}")
    with _made:
        if "app" not in globals():
            globals()["app"] = _worker_app()
    return globals()["app"]
