"""The `obsq` admin commands (stats, tasks, requeue, pause, unpause) against a live worker,
run through obsq.cli.main as a terminal would (in a thread: it runs its own event loop)."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

import obsq
from obsq import cli


@pytest.fixture
def obsq_cli(redis_url, namespace, capsys):
    async def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, [*argv, "--redis-url", redis_url,
                                                  "--namespace", namespace])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


async def test_stats_tasks_requeue_pause_and_unpause(app, client, start_worker,
                                                     obsq_cli) -> None:
    attempts: list[int] = []

    @app.task("charge")
    async def charge(task: obsq.Task):
        attempts.append(task.retry_count)
        if len(attempts) == 1:
            raise obsq.SkipRetry("card declined")
        return "charged"

    code, out = await obsq_cli("stats")
    assert (code, out.strip()) == (0, "no queues yet\n\n0 live worker(s)")

    worker = await start_worker(queues="billing")
    info = await client.enqueue("charge", {"amount": 5}, queue="billing", retention=60)
    await wait_until(lambda: _state(client, info.id, "dead"))

    code, out = await obsq_cli("stats")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["queue", "pending", "active", "scheduled", "retry", "dead",
                              "completed", "latency", "paused"]
    assert row.split()[:7] == ["billing", "0", "0", "0", "0", "1", "0"]
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
    await asyncio.sleep(0.3)  # the worker looks, and leaves the paused queue alone
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
    assert out.strip() == "moved 0 task(s) from dead to pending in default"


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
