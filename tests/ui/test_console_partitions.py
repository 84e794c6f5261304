"""A partitioned queue in the console, in a real chromium: the overview shows one row with
its whole depth and how many partitions it has (and how many are paused), the queue's page
a row for each partition and its tasks from all of them, a task's page its partition.
Screenshots at 1280x800 and 375 wide under the test's tmp dir."""

from __future__ import annotations

from pathlib import Path

from support import partitioned_events, wait_until

from obsq.inspection.inspector import Inspector
from obsq.names import partition_names

from .phone import fits_a_phone, phone_context

PARTS = partition_names("events", 3)


async def test_a_partitioned_queue_is_one_row_with_its_partitions_below(
        app, client, start_worker, browser, console_process, redis_url, namespace,
        tmp_path: Path) -> None:
    partitioned_events(app)
    await start_worker(queues="events")
    async with Inspector(redis_url, namespace) as inspector:
        for i in range(8):
            await client.enqueue("ev:click", "bad" if i % 4 == 0 else i, queue="events",
                                 retention=600)
        await wait_until(lambda: _depth(inspector, "completed", "dead", equals=8))
        await inspector.pause("events")
        for i in range(30):
            await client.enqueue("ev:view" if i % 2 else "ev:click", i, queue="events")
        await client.enqueue("ev:later", 0, queue="events", delay=3600)
        await inspector.unpause(PARTS[0])  # the worker drains partition 0 alone
        await wait_until(lambda: _partition_pending(inspector, 0, equals=0))
        info = await inspector.queue("events")
    pending = info.depth["pending"]
    assert pending == sum(p.depth["pending"] for p in info.partitions[1:]) > 0

    base = console_process()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(base + "/")
    rows = page.locator("table.queues tbody tr")
    assert await rows.count() == 1
    row = rows.first
    assert await row.locator("td.name a").inner_text() == "events"
    assert "3 partitions" in await row.locator("td.name").inner_text()
    assert "2 of 3 partitions paused" in await row.locator("td.name").inner_text()
    assert await row.locator("a.count.pending").inner_text() == str(pending)
    assert await row.locator("a.count.dead").inner_text() == "2"
    await page.screenshot(path=shots / "overview-1280.png")

    await page.click("text=events")
    table = page.locator("table.partitions tbody tr")
    await table.first.wait_for()
    assert [await r.locator("td.name code").inner_text() for r in await table.all()] == \
        list(PARTS)
    assert [await r.locator("td[data-label=Index]").inner_text()
            for r in await table.all()] == ["0/3", "1/3", "2/3"]
    assert [await r.locator("td[data-label=Pending]").inner_text()
            for r in await table.all()] == [str(p.depth["pending"]) for p in info.partitions]
    assert await page.locator("table.tasks tbody tr").count() == min(pending, 25)
    assert f"of {pending} pending" in await page.locator("nav.pager").last.inner_text()
    await page.screenshot(path=shots / "queue-1280.png", full_page=True)

    await page.locator("table.tasks tbody tr a").first.click()
    await page.wait_for_selector("dt:has-text('Partition')")
    partition = await page.locator("dt:has-text('Partition') + dd").inner_text()
    assert partition in PARTS[1:]
    await page.screenshot(path=shots / "task-1280.png", full_page=True)

    phone = await phone_context(browser)
    small = await phone.new_page()
    await fits_a_phone(small, base + "/queues/events", "queue", shots)
    await small.locator("#partitions").screenshot(path=shots / "partitions-375.png")
    await phone.close()
    await context.close()
    print(f"screenshots in {shots}")


async def _depth(inspector: Inspector, *states: str, equals: int) -> bool:
    depth = (await inspector.queue("events")).depth
    return sum(depth[s] for s in states) == equals


async def _partition_pending(inspector: Inspector, index: int, equals: int) -> bool:
    return (await inspector.queue("events")).partitions[index].depth["pending"] == equals
