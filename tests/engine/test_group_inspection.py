"""What an operator sees of task groups, on a real Redis: Inspector.groups and group_tasks
(pages bounded on a queue of 2,000 groups, due times given the App, batches claimed or
failing, batch records damaged by hand) and `obsq groups`."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

import obsq
from obsq.inspection.inspector import MAX_PAGE, Inspector

RULES = [("ingest:", 3, 600.0, 600.0)]  # (pattern, max_size, max_delay, grace) for claims


async def test_2000_groups_come_in_bounded_pages(client, inspector: Inspector) -> None:
    jobs = [("ingest:a", n) for n in range(1500)] + [("ingest:b", n) for n in range(500)]
    await asyncio.gather(*(client.enqueue(t, n, group=f"g{n:04d}") for t, n in jobs))
    await client.enqueue("ingest:a", "second", group="g0007")
    seen, offset, pages = [], 0, 0
    while offset is not None:
        page = await inspector.groups("default", limit=300, offset=offset)
        assert len(page.groups) <= 300 and page.total == 2000
        seen += page.groups
        offset, pages = page.next_offset, pages + 1
    assert pages == 7
    assert len({(g.type, g.group) for g in seen}) == 2000
    assert [g.type for g in seen] == ["ingest:a"] * 1500 + ["ingest:b"] * 500
    oldest = [g.oldest_at for g in seen[:1500]]
    assert oldest == sorted(oldest)  # each type's oldest group first
    [g7] = [g for g in seen if (g.type, g.group) == ("ingest:a", "g0007")]
    assert g7.size == 2 and g7.newest_at >= g7.oldest_at and g7.age >= g7.idle >= 0
    assert g7.due_at is None  # the App was not given
    assert (await inspector.groups("default", limit=10, offset=2000)).groups == []
    with pytest.raises(ValueError, match=f"limit must be 1 to {MAX_PAGE}"):
        await inspector.groups("default", limit=MAX_PAGE + 1)
    with pytest.raises(obsq.QueueNotFound):
        await inspector.groups("nosuchqueue")


async def test_a_groups_tasks_oldest_first_a_page_at_a_time(client,
                                                            inspector: Inspector) -> None:
    ids = [(await client.enqueue("ingest:a", n, group="big", queue="rows")).id
           for n in range(45)]
    await client.enqueue("ingest:a", "other", group="small", queue="rows")
    got, offset = [], 0
    while offset is not None:
        page = await inspector.group_tasks("rows", "ingest:a", "big", limit=20, offset=offset)
        assert page.total == 45 and page.state == "aggregating"
        got += page.tasks
        offset = page.next_offset
    assert [t.id for t in got] == ids
    assert [t.payload for t in got[:3]] == ["0", "1", "2"]
    assert (await inspector.group_tasks("rows", "ingest:a", "none")).total == 0


async def test_due_times_follow_the_apps_rules(app, client, inspector: Inspector) -> None:
    app.aggregate("ingest:", lambda group, tasks: ("x", 0), max_size=3, max_delay=600,
                  grace_period=60)
    for n in range(3):
        await client.enqueue("ingest:a", n, group="full")
    await client.enqueue("ingest:a", 0, group="young")
    await client.enqueue("other", 0, group="lost")
    page = await inspector.groups("default", app=app)
    by_group = {g.group: g for g in page.groups}
    full, young = by_group["full"], by_group["young"]
    assert full.due_at <= young.due_at  # full: due now
    assert young.due_at == young.newest_at + timedelta(seconds=60)  # the grace period first
    assert by_group["lost"].due_at is None  # no aggregator covers its type


async def test_batches_claimed_and_failing_and_damaged_records(
        client, broker, inspector: Inspector, raw_redis, namespace, obsq_cli) -> None:
    for group in ("a", "b", "c", "d"):
        for n in range(3):
            await client.enqueue("ingest:row", n, group=group)
    claimed = (await broker.claim_batches("default", "worker-1", 600, RULES, 4)).batches
    failing, running, emptied, junk = claimed
    await broker.end_batch(failing, "RuntimeError: the <b>store</b> is down", retry_in=300)
    prefix = f"{namespace}:{{default}}:"
    raw_redis.hset(prefix + "batch:" + emptied.id, "failures", "lots")
    raw_redis.hdel(prefix + "batch:" + emptied.id, "ids")
    raw_redis.delete(prefix + "batch:" + junk.id)
    raw_redis.set(prefix + "batch:" + junk.id, "not a hash")
    raw_redis.zadd(prefix + "batches", {"ghost": 1})  # a claim whose hash is gone

    page = await inspector.groups("default")
    assert page.groups == [] and page.batch_total == 5
    by_id = {b.id: b for b in page.batches}
    assert page.batches[0].id == "ghost"  # soonest claim end first
    f = by_id[failing.id]
    assert (f.type, f.group, f.size, f.failures, f.worker) == (
        "ingest:row", failing.group, 3, 1, None)
    assert f.error == "RuntimeError: the <b>store</b> is down"
    r = by_id[running.id]
    assert (r.size, r.failures, r.worker, r.error) == (3, 0, "worker-1", None)
    assert page.batches[1].id == failing.id  # its backoff (300 s) ends before the claims
    assert f.claim_expires_at < r.claim_expires_at
    e = by_id[emptied.id]
    assert (e.size, e.failures, e.type) == (0, 0, "ingest:row")
    assert "not a hash" in by_id[junk.id].error and by_id[junk.id].size == 0
    assert "gone" in by_id["ghost"].error

    code, out = await obsq_cli("groups", "default")
    assert code == 0 and "Traceback" not in out
    assert "no task groups in default" in out and "5 batch(es) claimed or failing" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("batch"))
    assert header.split() == ["batch", "type", "group", "tasks", "claim", "until", "(UTC)",
                              "failures", "worker", "error"]
    assert any(failing.id in line and "RuntimeError: the <b>store</b> is down" in line
               for line in lines)
    assert any(running.id in line and "worker-1" in line for line in lines)
    code, out = await obsq_cli("groups", "default", "--json")
    data = json.loads(out)
    assert code == 0 and data["batch_total"] == 5 and len(data["batches"]) == 5


async def test_obsq_groups_lists_groups_and_a_groups_tasks(client, obsq_cli) -> None:
    ids = [(await client.enqueue("ingest:row", n, group="sensor-1")).id for n in range(4)]
    await client.enqueue("ingest:row", 9, group="sensor-2")
    code, out = await obsq_cli("groups", "default", "--app", "tests.engine.fanout_apps:app")
    assert code == 0
    header, first, second = out.splitlines()[:3]
    assert header.split() == ["type", "group", "size", "oldest", "idle", "due", "(UTC)"]
    assert first.split()[:3] == ["ingest:row", "sensor-1", "4"]
    assert second.split()[:3] == ["ingest:row", "sensor-2", "1"]
    assert "2 shown of 2 group(s)" in out and "0 batch(es) claimed or failing" in out

    code, out = await obsq_cli("groups", "default", "--limit", "1")
    assert "next page: --offset 1" in out and "due" not in out.splitlines()[0]
    code, out = await obsq_cli("groups", "default", "--type", "ingest:row", "--group",
                               "sensor-1", "--limit", "3")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:4]] == ids[:3]
    assert "3 shown, 4 in group sensor-1 of ingest:row; next page: --offset 3" in out
    code, out = await obsq_cli("groups", "default", "--json")
    data = json.loads(out)
    assert [(g["group"], g["size"]) for g in data["groups"]] == [("sensor-1", 4),
                                                                  ("sensor-2", 1)]
    code, out = await obsq_cli("groups", "nosuchqueue")
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert out.startswith("obsq groups: no queue 'nosuchqueue' in namespace")
    code, out = await obsq_cli("groups", "default", "--group", "sensor-1")
    assert code == 1 and "--type and --group go together" in out
