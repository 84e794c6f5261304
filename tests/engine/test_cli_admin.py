"""The `obsq` admin commands (stats, queues, tasks, task, workers, schedules, requeue,
delete, purge, pause, unpause) against a live worker and scheduler, run through
obsq.cli.main as a terminal would (in a thread: it runs its own event loop)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from support import wait_until

import obsq
from obsq import cli


async def test_stats_tasks_requeue_pause_and_unpause(app, client, start_worker, namespace,
                                                     obsq_cli, raw_redis) -> None:
    attempts: list[int] = []

    @app.task("charge")
    async def charge(task: obsq.Task):
        attempts.append(task.retry_count)
        if len(attempts) == 1:
            raise obsq.SkipRetry("card declined")
        return "charged"

    code, out = await obsq_cli("stats")
    assert code == 0 and out.startswith(f"no queues in namespace '{namespace}'")
    assert out.rstrip().endswith("0 live worker(s)")

    worker = await start_worker(queues="billing")
    info = await client.enqueue("charge", {"amount": 5}, queue="billing", retention=60)
    await wait_until(lambda: _state(client, info.id, "dead"))

    code, out = await obsq_cli("stats")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["queue", "pending", "active", "scheduled", "retry", "dead",
                              "completed", "cancelled", "aggregating", "latency", "paused"]
    assert row.split()[:9] == ["billing", "0", "0", "0", "0", "1", "0", "0", "0"]
    assert "1 live worker(s)" in out and worker.id in out

    code, out = await obsq_cli("tasks", "billing", "dead")
    assert code == 0
    assert info.id in out and "charge" in out and "SkipRetry: card declined" in out
    code, out = await obsq_cli("tasks", "billing", "pending")
    assert out.strip() == "no pending tasks in billing"

    code, out = await obsq_cli("requeue", "billing")
    assert (code, out.strip()) == (0, "moved 1 task(s) from dead to pending in billing")
    assert await client.result(info, timeout=10) == "charged"
    assert attempts == [0, 0]  # a requeued dead task starts with a fresh retry count
    code, out = await obsq_cli("tasks", "billing", "completed")
    assert info.id in out

    code, out = await obsq_cli("pause", "billing")
    assert (code, out.strip()) == (0, "queue billing paused")
    code, out = await obsq_cli("stats")
    assert out.splitlines()[1].split()[-1] == "yes"
    held = await client.enqueue("charge", queue="billing", retention=60)
    other = await client.enqueue("charge", queue="elsewhere")
    # the worker took the wake-up of that enqueue, with a fetch of billing right behind it
    await wait_until(lambda: raw_redis.llen(f"{namespace}:{{billing}}:wake") == 0,
                     what="the worker looking at billing")
    assert (await client.info(held.id)).state == "pending"

    code, out = await obsq_cli("unpause", "billing")
    assert (code, out.strip()) == (0, "queue billing unpaused")
    assert await client.result(held, timeout=10) == "charged"
    assert (await client.info(other.id)).state == "pending"  # no worker serves it


async def test_requeue_by_id_and_from_the_retry_set(app, client, obsq_cli) -> None:
    first = await client.enqueue("t", 1, delay=3600)
    second = await client.enqueue("t", 2, delay=3600)
    code, out = await obsq_cli("requeue", "default", second.id, "--state", "scheduled")
    assert (code, out.strip()) == (0, "moved 1 task(s) from scheduled to pending in default")
    assert (await client.info(second.id)).state == "pending"
    assert (await client.info(first.id)).state == "scheduled"
    code, out = await obsq_cli("requeue", "default", "no-such-id")
    assert (code, out.strip()) == (1, "obsq requeue: not in dead of default: no-such-id")


async def test_admin_commands_report_bad_input_in_one_line(obsq_cli, caplog) -> None:
    code, _ = await obsq_cli("pause", "bad{queue}")
    assert code == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith("obsq pause: queue 'bad{queue}' must be")
    assert record.exc_info is None
    with pytest.raises(SystemExit):  # argparse rejects an unknown state
        cli.main(["tasks", "default", "sleeping"])


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def test_unknown_queues_and_tasks_fail_in_one_line(client, obsq_cli) -> None:
    await client.enqueue("t", queue="mail")
    for argv, message in [
        (("pause", "nosuchqueue"), "obsq pause: no queue 'nosuchqueue' in namespace"),
        (("tasks", "nosuchqueue", "dead"), "obsq tasks: no queue 'nosuchqueue'"),
        (("purge", "nosuchqueue", "dead"), "obsq purge: no queue 'nosuchqueue'"),
        (("task", "no-such-id"), "obsq task: no task 'no-such-id'"),
        (("delete", "no-such-id"), "obsq delete: no task 'no-such-id'"),
    ]:
        code, out = await obsq_cli(*argv)
        assert code == 1, argv
        assert out.startswith(message) and len(out.strip().splitlines()) == 1, out
    code, out = await obsq_cli("pause", "nosuchqueue")
    assert "(its queues: mail)" in out


async def test_an_empty_namespace_names_the_ones_that_exist(client, admin_redis_url,
                                                           namespace, capsys,
                                                           monkeypatch) -> None:
    await client.enqueue("t")
    monkeypatch.delenv("OBSQ_NAMESPACE", raising=False)
    capsys.readouterr()  # the default namespace, outside a test user's rule: as the admin
    code = await asyncio.to_thread(cli.main, ["queues", "--redis-url", admin_redis_url])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("no queues in namespace 'obsq'")
    assert namespace in out and "(--namespace NS)" in out


async def test_inspection_commands_print_tables_and_json(app, client, start_worker,
                                                         obsq_cli, monkeypatch) -> None:
    @app.task("charge", max_retry=0)
    async def charge(task: obsq.Task):
        raise ValueError(f"card {task.payload['card']} declined")

    worker = await start_worker(queues="billing")
    info = await client.enqueue("charge", {"card": "<4242>"}, queue="billing",
                                headers={"tenant": "t1"})
    await wait_until(lambda: _state(client, info.id, "dead"))

    code, out = await obsq_cli("task", info.id)
    assert code == 0
    assert "state       dead" in out and "ValueError: card <4242> declined" in out
    assert '"card": "<4242>"' in out and "Traceback (most recent call last)" in out
    assert '"tenant": "t1"' in out and "\x1b[" not in out  # no colour off a terminal
    code, out = await obsq_cli("task", info.id, "--json")
    detail = json.loads(out)
    assert detail["payload"] == {"card": "<4242>"} and detail["state"] == "dead"
    assert "charge" in detail["traceback"]

    code, out = await obsq_cli("tasks", "billing", "dead", "--json")
    assert [t["id"] for t in json.loads(out)["tasks"]] == [info.id]
    code, out = await obsq_cli("queues")
    header, row = out.splitlines()[:2]
    assert header.split()[-4:] == ["runs/min", "failed/min", "runs/h", "failed/h"]
    assert row.split()[:8] == ["billing", "-", "0", "0", "0", "0", "1", "0"]  # - partitions
    code, out = await obsq_cli("queues", "--json")
    assert json.loads(out)[0]["depth"]["dead"] == 1
    code, out = await obsq_cli("workers", "--json")
    assert [w["id"] for w in json.loads(out)] == [worker.id]
    code, out = await obsq_cli("workers")
    assert worker.id in out and "heartbeat" in out.splitlines()[0]
    code, out = await obsq_cli("stats", "--json")
    assert set(json.loads(out)) == {"queues", "workers"}

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    code, out = await obsq_cli("tasks", "billing", "dead")
    assert "\x1b[31m" in out  # the error in red on a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    code, out = await obsq_cli("tasks", "billing", "dead")
    assert "\x1b[" not in out

    code, out = await obsq_cli("delete", info.id)
    assert (code, out.strip()) == (0, f"deleted task {info.id} (it was dead)")


async def test_purge_deletes_every_task_of_a_state(client, obsq_cli, caplog) -> None:
    await client.enqueue_many([obsq.Job("t", i, delay=600) for i in range(1500)])
    code, _ = await obsq_cli("purge", "default", "scheduled")  # no terminal to ask: refused
    assert code == 2 and "confirm with --yes" in caplog.text
    assert (await client.info((await client.enqueue("t", 0, delay=600)).id)).state == \
        "scheduled"
    code, out = await obsq_cli("purge", "default", "scheduled", "--yes")
    assert (code, out.strip()) == (0, "deleted 1501 scheduled task(s) of default")
    code, out = await obsq_cli("tasks", "default", "scheduled")
    assert out.strip() == "no scheduled tasks in default"


async def test_schedules_as_a_table_and_as_json(app, client, start_scheduler, raw_redis,
                                                namespace, obsq_cli) -> None:
    code, out = await obsq_cli("schedules")
    assert code == 0 and out.startswith(f"no schedules in namespace '{namespace}'")
    app.periodic("@every 0.5s", "tick", name="ticker")
    await client.schedule("nightly", "0 3 * * *", "report:nightly", timezone="Europe/Paris",
                          missed="skip")
    await client.schedule("broken", "@every 1h", "tick")
    raw_redis.hset(f"{namespace}:{{schedules}}:entries", "broken", "{}")
    await start_scheduler()
    await wait_until(lambda: _schedule_fired(client, "ticker"))

    code, out = await obsq_cli("schedules")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["schedule", "spec", "timezone", "task", "if-missed",
                              "next", "(UTC)", "last", "(UTC)", "fired", "missed", "from"]
    table = {row.split()[0]: row for row in rows if row and not row.startswith("schedule '")}
    assert table["nightly"].split()[1:9] == ["0", "3", "*", "*", "*", "Europe/Paris",
                                             "report:nightly", "skip"]
    assert table["nightly"].split()[-3:] == ["0", "0", "client"]
    assert table["ticker"].split()[1:6] == ["@every", "0.5s", "UTC", "tick", "once"]
    assert table["ticker"].split()[-1] == "app" and "not valid" in table["broken"]
    assert "schedule 'broken' in Redis is not valid: it has no 'spec'; the scheduler " \
           "skips it" in out

    code, out = await obsq_cli("schedules", "--json")
    assert code == 0
    listed = {s["name"]: s for s in json.loads(out)}
    assert listed["nightly"]["timezone"] == "Europe/Paris"
    assert listed["nightly"]["next_fire_at"].endswith(("T01:00:00+00:00", "T02:00:00+00:00"))
    assert listed["nightly"]["last_fire_at"] is None and listed["nightly"]["missed"] == "skip"
    assert listed["ticker"]["fire_count"] >= 1 and listed["ticker"]["last_fire_at"]
    assert listed["broken"]["error"].startswith("schedule 'broken' in Redis is not valid")


async def _schedule_fired(client: obsq.Client, name: str) -> bool:
    return any(s.name == name and s.fire_count for s in await client.schedules())


async def test_a_task_that_failed_then_completed_says_its_error_is_an_earlier_attempts(
        app, client, start_worker, obsq_cli, redis_url, namespace) -> None:
    """`obsq task` labels the error and traceback of a completed task as its last failed
    attempt's, gives the default max_retry as a number and says no worker runs it;
    `obsq tasks Q completed` shows no error column."""
    tries: list[int] = []

    @app.task("flaky", retry_delay=0.1)
    async def flaky(task: obsq.Task):
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("not yet")

    await start_worker()
    async with obsq.Client(redis_url, namespace) as bare:  # no App: no max_retry kept
        info = await bare.enqueue("flaky", retention=60)
    await wait_until(lambda: _state(client, info.id, "completed"))
    code, out = await obsq_cli("task", info.id)
    assert code == 0, out
    lines = {line[:12].strip(): line[12:] for line in out.splitlines()}
    assert lines["error"] == ("RuntimeError: not yet (of the last failed attempt; retried, "
                              "then completed)")
    assert "traceback (of the last failed attempt; retried, then completed)" in out
    assert lines["retries"] == "1 of 25 (the default, unless its route sets max_retry)"
    assert lines["worker"] == "none running it"
    code, out = await obsq_cli("tasks", "default", "completed")
    assert code == 0 and "error" not in out.splitlines()[0] and "not yet" not in out, out
