"""obsq.django: Django's task API on obsq, with a real Django project (examples/django, the
guide's shop: settings, an SQLite database, orders/tasks.py) and a real Redis. A worker runs
as in production, `obsq worker obsq.django:app` in a process of its own with
DJANGO_SETTINGS_MODULE; this process is the web side, enqueueing through the backend and
reading results back. The shop's own tests (obsq.testing) pass as its guide runs them."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support import (
    ROOT,
    ObsqProcess,
    missing_tool,
    obsq_env,
    one_clear_line,
    run_obsq,
    sync_redis,
    wait_for,
)

import obsq
from obsq.redis_server import free_port

try:
    import django
except ImportError:
    missing_tool("Django is not installed (pip install --group test)")

EXAMPLE = ROOT / "examples" / "django"
TESTS = ROOT / "tests"
TIMEOUT = 30.0  # seconds a task of these tests may take from its enqueue to its end


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, session_redis: Callable[[bool], str]
         ) -> Iterator[dict[str, Any]]:
    """The example shop set up in this process (its database made), a namespace of its own,
    TASKS pointed there, and `obsq worker obsq.django:app` serving it with one slot, so its
    tasks run one after another on one thread."""
    database = tmp_path_factory.mktemp("shop") / "shop.sqlite3"
    sys.path[:0] = [str(EXAMPLE)]
    given = {"DJANGO_SETTINGS_MODULE": "mysite.settings", "SHOP_DATABASE": str(database)}
    os.environ.update(given)  # read once, by the setup: the other tests' processes go without
    django.setup()
    for name in given:
        del os.environ[name]
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    call_command("migrate", run_syncdb=True, verbosity=0)
    redis_url, namespace = session_redis(False), f"t{uuid.uuid4().hex[:10]}"
    where = {"redis_url": redis_url, "namespace": namespace}
    override = override_settings(TASKS={
        alias: {**backend, "OPTIONS": {**backend["OPTIONS"], **where}}
        for alias, backend in settings.TASKS.items()})
    override.enable()
    port = free_port()
    worker = ObsqProcess(
        ["worker", "obsq.django:app", "--concurrency", "1", "--http-port", str(port)],
        env=obsq_env(DJANGO_SETTINGS_MODULE="mysite.settings", SHOP_DATABASE=str(database),
                     OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                     PYTHONPATH=os.pathsep.join(map(str, (ROOT, EXAMPLE, TESTS)))),
        cwd=tmp_path_factory.mktemp("worker"), log_path=database.with_name("worker.log"))
    try:
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status
                 == 200, timeout=60, what="the worker to be ready")
        yield {"port": port, "database": database, "redis_url": redis_url, "namespace": namespace,
               "worker": worker, "tasks": importlib.import_module("orders.tasks"),
               "models": importlib.import_module("orders.models"),
               "probes": importlib.import_module("django_probes")}
    finally:
        worker.stop()
        print(worker.log()[-3000:])
        worker.close()
        override.disable()
        keys = sync_redis(redis_url)
        for key in keys.scan_iter(match=f"{namespace}:*", count=1000):
            keys.unlink(key)
        keys.close()


def ended(result: Any) -> Any:
    def done() -> bool:
        result.refresh()
        return result.is_finished
    wait_for(done, timeout=TIMEOUT, what=f"the end of task {result.id}")
    return result


def files_open(pid: int, path: Path) -> int:
    """How many descriptors of process `pid` hold `path` open (Linux's /proc)."""
    held = 0
    for descriptor in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed since the listing
            held += os.readlink(descriptor) == str(path)
    return held


def obsq_info(shop: dict[str, Any], task_id: str) -> obsq.TaskInfo:
    with obsq.SyncClient(shop["redis_url"], shop["namespace"]) as client:
        return client.info(task_id)


def test_a_task_runs_in_the_worker_and_its_result_reads_back(shop: dict[str, Any]) -> None:
    order = shop["models"].Order.objects.create(email="ada@example.com", total_cents=4200)
    result = shop["tasks"].send_receipt.enqueue(order.pk)
    assert result.status == "READY" and result.args == [order.pk] and result.backend == "default"
    ended(result)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == f"receipt for order {order.pk} sent to ada@example.com"
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.finished_at
    order.refresh_from_db()
    assert order.receipt_sent_at is not None
    # an obsq task like any other: its type names the Django task, its result is kept
    info = obsq_info(shop, result.id)
    assert (info.type, info.queue, info.priority, info.state) == (
        "django:orders.tasks.send_receipt", "default", 5, "completed")
    assert info.result == result.return_value
    # the Task's own get_result checks the result is its task's
    assert shop["tasks"].send_receipt.get_result(result.id).return_value == result.return_value
    with pytest.raises(Exception, match="Task does not match"):
        shop["tasks"].charge.get_result(result.id)


def test_a_task_that_raises_is_failed_with_its_error(shop: dict[str, Any]) -> None:
    order = shop["models"].Order.objects.create(email="bob@example.com", total_cents=500_000)
    result = ended(shop["tasks"].charge.enqueue(order.pk))
    assert result.status == "FAILED"
    (error,) = result.errors
    assert error.exception_class_path == "orders.tasks.CardDeclined"
    assert error.exception_class is shop["tasks"].CardDeclined
    assert error.traceback.rstrip().endswith(
        f"orders.tasks.CardDeclined: order {order.pk}: 500000 cents is over the limit")
    assert "in charge" in error.traceback  # from the task's own frame
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    info = obsq_info(shop, result.id)
    assert (info.state, info.retry_count) == ("dead", 0)  # Django's tasks are not retried


def test_a_builtin_error_is_named_by_its_module() -> None:
    from obsq.django import _class_path

    assert _class_path("KeyError: 'x'", "Traceback ...\nKeyError: 'x'\n") == "builtins.KeyError"
    assert _class_path("TaskTimeout: ran longer", None) == "obsq.errors.TaskTimeout"
    assert _class_path("Boom: a\nb", "Traceback\n  ...\nmy.mod.Boom: a\nb\n") == "my.mod.Boom"


def test_priority_and_queue_name_become_obsq_s(shop: dict[str, Any]) -> None:
    from obsq.django import obsq_priority

    mapped = [obsq_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped) and set(mapped) == set(range(10))
    assert (obsq_priority(-100), obsq_priority(-1), obsq_priority(0), obsq_priority(100)) == (
        0, 4, 5, 9)
    assert [mapped.count(level) for level in range(10)] == [20] * 9 + [21]
    order = shop["models"].Order.objects.create(email="cy@example.com", total_cents=100)
    charge = shop["tasks"].charge
    given = [charge.enqueue(order.pk),  # the task's own: payments, 50
             charge.using(priority=-100).enqueue(order.pk),
             charge.using(priority=100, queue_name="default").enqueue(order.pk)]
    seen = [(i.queue, i.priority) for i in (obsq_info(shop, r.id) for r in given)]
    assert seen == [("payments", 7), ("payments", 0), ("default", 9)]
    for result, priority, queue in zip(given, (50, -100, 100), ("payments", "payments",
                                                                "default")):
        ended(result)
        assert result.status == "SUCCESSFUL"
        assert (result.task.priority, result.task.queue_name) == (priority, queue)
    with pytest.raises(Exception, match="Queue 'other' is not valid"):
        charge.using(queue_name="other")


def test_run_after_holds_the_task_until_then(shop: dict[str, Any]) -> None:
    from django.utils import timezone

    order = shop["models"].Order.objects.create(email="di@example.com", total_cents=100)
    run_after = timezone.now() + timedelta(seconds=2)
    result = shop["tasks"].send_receipt.using(run_after=run_after).enqueue(order.pk)
    held = shop["tasks"].send_receipt.get_result(result.id)
    assert held.status == "READY" and held.task.run_after == run_after
    assert obsq_info(shop, result.id).state == "scheduled"
    ended(result)
    assert result.status == "SUCCESSFUL"
    order.refresh_from_db()
    assert order.receipt_sent_at >= run_after


def test_a_task_that_takes_context_gets_its_attempt(shop: dict[str, Any]) -> None:
    """sync_stock is of the backend `retried` (max_retry 3): its first run fails."""
    result = ended(shop["tasks"].sync_stock.enqueue("slow-7"))
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"sku": "slow-7", "attempt": 2, "task": result.id}
    assert result.attempts == 2
    assert obsq_info(shop, result.id).retry_count == 1
    first = ended(shop["tasks"].sync_stock.enqueue("fast-7"))
    assert first.return_value["attempt"] == first.attempts == 1


def test_each_task_leaves_the_database_connection_as_django_s_workers_do(
        shop: dict[str, Any]) -> None:
    """CONN_MAX_AGE is 0 (Django's default): the connection a task opened is closed after
    it, so an idle worker holds none (its process has the database file open no more), and
    the next task on the thread (one slot: the same thread) starts without one. The signals
    go round each task, a failed one's too."""
    probes = shop["probes"]
    assert [ended(probes.left_open.enqueue()).return_value for _ in range(3)] == [False] * 3
    assert files_open(shop["worker"].pid, shop["database"]) == 0
    # a connection within its CONN_MAX_AGE is kept after a task, and one past it is closed
    # before the next task on the thread starts
    ended(probes.keep_open_for.enqueue(1.0))
    assert files_open(shop["worker"].pid, shop["database"]) == 1
    time.sleep(1.5)
    assert ended(probes.left_open.enqueue()).return_value is False
    order = shop["models"].Order.objects.create(email="ed@example.com", total_cents=900_000)
    failed = ended(shop["tasks"].charge.enqueue(order.pk))
    seen = ended(probes.signals_seen.enqueue()).return_value
    assert seen["started"] is True
    assert seen["finished"][failed.id] == "FAILED"


def test_an_async_task_runs(shop: dict[str, Any]) -> None:
    assert ended(shop["probes"].add.enqueue(2, 3)).return_value == 5


def test_enqueue_on_commit_enqueues_nothing_until_the_commit(shop: dict[str, Any]) -> None:
    from django.db import transaction
    from django.test import Client

    try:
        from django.tasks.signals import task_enqueued
    except ImportError:
        from django_tasks.signals import task_enqueued
    enqueued: list[str] = []

    def record(sender: type, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result.task.name)

    task_enqueued.connect(record)
    try:
        Order, send_receipt = shop["models"].Order, shop["tasks"].send_receipt
        with transaction.atomic():
            order = Order.objects.create(email="fi@example.com", total_cents=100)
            transaction.on_commit(partial(send_receipt.enqueue, order.pk))
            assert enqueued == []
        assert enqueued == ["send_receipt"]
        with contextlib.suppress(RuntimeError), transaction.atomic():
            order = Order.objects.create(email="gu@example.com", total_cents=100)
            transaction.on_commit(partial(send_receipt.enqueue, order.pk))
            raise RuntimeError("rolled back")
        assert enqueued == ["send_receipt"]
        # the shop's view (orders/views.py): both tasks after the commit, and the worker
        # finds the order
        response = Client().post("/orders/", {"email": "ha@example.com", "total_cents": 300})
        assert response.status_code == 201
        assert enqueued == ["send_receipt", "charge", "send_receipt"]
        order = Order.objects.get(pk=response.json()["order"])
        wait_for(lambda: Order.objects.get(pk=order.pk).paid, timeout=TIMEOUT, what="paid")
    finally:
        task_enqueued.disconnect(record)


def test_through_the_outbox_a_task_is_written_with_its_transaction(
        shop: dict[str, Any]) -> None:
    """OPTIONS' `outbox`: the enqueue writes a row in the transaction it runs in (none when
    it rolls back); the relay moves the committed row to Redis, the worker runs it, and the
    TaskResult's id is the task's."""
    import asyncio

    from django.db import transaction
    from sqlalchemy import create_engine, text

    from obsq.outbox import Outbox, Relay

    engine = create_engine(f"sqlite:///{shop['database']}")
    Outbox(engine).create_table()
    Order, send_receipt = shop["models"].Order, shop["tasks"].send_receipt
    outboxed = send_receipt.using(backend="outboxed")
    with contextlib.suppress(RuntimeError), transaction.atomic():
        order = Order.objects.create(email="ro@example.com", total_cents=100)
        outboxed.enqueue(order.pk)
        raise RuntimeError("rolled back")
    with transaction.atomic():
        order = Order.objects.create(email="ib@example.com", total_cents=100)
        result = outboxed.enqueue(order.pk)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT task_id FROM obsq_outbox")).scalars().all() == [
            result.id]

    async def relay() -> int:
        async with obsq.Client(shop["redis_url"], shop["namespace"]) as client:
            return await Relay(engine, client).relay_batch()
    assert asyncio.run(relay()) == 1
    assert ended(result).status == "SUCCESSFUL"
    assert result.return_value == f"receipt for order {order.pk} sent to ib@example.com"
    engine.dispose()


def test_a_result_that_is_not_there_does_not_exist(shop: dict[str, Any]) -> None:
    try:
        from django.tasks.exceptions import TaskResultDoesNotExist
    except ImportError:
        from django_tasks.exceptions import TaskResultDoesNotExist
    send_receipt = shop["tasks"].send_receipt
    with pytest.raises(TaskResultDoesNotExist):
        send_receipt.get_result("no-such-task")
    with obsq.SyncClient(shop["redis_url"], shop["namespace"]) as client:  # not Django's
        other = client.enqueue("report:build", {"x": 1}, queue="elsewhere", retention=60)
    with pytest.raises(TaskResultDoesNotExist):
        send_receipt.get_backend().get_result(other.id)


def test_the_worker_s_metrics_name_each_django_task(shop: dict[str, Any]) -> None:
    """The tasks of the installed apps' tasks modules get routes of their own; others (the
    probes) share the `django:` prefix."""
    ended(shop["tasks"].send_receipt.enqueue(
        shop["models"].Order.objects.create(email="io@example.com", total_cents=1).pk))
    ended(shop["probes"].add.enqueue(1, 1))
    text = urllib.request.urlopen(f"http://127.0.0.1:{shop['port']}/metrics").read().decode()
    processed = dict(re.findall(r'obsq_tasks_processed_total\{([^}]*)\} (\S+)', text))
    def count(labels: str) -> float:
        return sum(float(v) for k, v in processed.items() if all(
            f'{pair}' in k for pair in labels.split(",")))
    assert count('task="django:orders.tasks.send_receipt",outcome="success"') >= 1
    assert count('task="django:",outcome="success"') >= 1


def test_a_worker_without_django_s_settings_says_so() -> None:
    env = obsq_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    one_clear_line(run_obsq("worker", "obsq.django:app", env=env), "set DJANGO_SETTINGS_MODULE")
    env["DJANGO_SETTINGS_MODULE"] = "nosuch.settings"
    one_clear_line(run_obsq("worker", "obsq.django:app", env=env), "No module named 'nosuch'")


def test_the_shop_s_own_tests_pass_with_obsq_testing() -> None:
    """examples/django/test_orders.py and its conftest, as the guide runs them: pytest on the
    project, with obsq's plugin."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("SHOP_DATABASE", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "obsq.pytest_plugin", str(EXAMPLE / "test_orders.py")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_an_option_the_backend_does_not_take_is_refused(shop: dict[str, Any]) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from obsq.django import ObsqBackend

    with pytest.raises(ImproperlyConfigured, match="has no redis_host: it takes redis_url"):
        ObsqBackend("default", {"OPTIONS": {"redis_host": "localhost"}})
    with pytest.raises(ImproperlyConfigured, match="max_retry'] must be a whole number"):
        ObsqBackend("default", {"OPTIONS": {"max_retry": "3"}})
    with pytest.raises(ImproperlyConfigured, match="'replica' is none of DATABASES"):
        ObsqBackend("default", {"OPTIONS": {"outbox": "replica"}})
    backend = ObsqBackend("default", {"OPTIONS": {"namespace": "shop"}})
    assert (backend.namespace, backend.max_retry, backend.retention) == ("shop", 0, 86400)


def test_a_cancelled_task_is_failed(shop: dict[str, Any]) -> None:
    from django.utils import timezone

    send_receipt = shop["tasks"].send_receipt
    result = send_receipt.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1)
    with obsq.SyncClient(shop["redis_url"], shop["namespace"]) as client:
        client.cancel(result.id)
    result.refresh()
    assert result.status == "FAILED"
    assert [e.exception_class_path for e in result.errors] == ["obsq.errors.TaskCancelled"]
    assert result.errors[0].exception_class is obsq.TaskCancelled
