"""A state badge in the console, in a real chromium: a cancelled task, flow or step has one
neutral style on every page that shows it, apart from failed's and dead's red, and the queue's
state tabs show no scroll widget at 1280x800. Screenshots under the test's tmp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support import wait_until

import obsq
from obsq import Job, chain

BADGE_STYLE = ("s => { const c = getComputedStyle(s);"
               " return [c.backgroundColor, c.color, c.boxShadow].join(' / '); }")


async def test_cancelled_has_its_own_badge_and_the_tabs_no_scrollbar(
        app, client, start_worker, browser, console_process, tmp_path: Path) -> None:
    @app.task("charge", max_retry=0)
    async def charge(task: obsq.Task):
        raise RuntimeError("card declined")

    await start_worker(queues="billing")
    dead = await client.enqueue("charge", {}, queue="billing")
    failed = await client.enqueue(chain(Job("charge", {}, queue="billing")))
    await wait_until(lambda: _state(client, dead.id, "dead"))
    cancelled = await client.enqueue("charge", {}, queue="billing", delay=3600)
    assert await client.cancel(cancelled.id) == "cancelled"
    stopped = await client.enqueue(chain(Job("charge", {}, queue="billing", delay=3600),
                                         Job("charge", {}, queue="billing")))
    await client.cancel(stopped)
    await wait_until(lambda: _flow_state(client, failed, "failed"))

    base = console_process()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()

    await page.goto(f"{base}/queues/billing?state=cancelled")
    tabs = page.locator("nav.tabs")
    overflow = await tabs.evaluate("t => [t.scrollWidth - t.clientWidth,"
                                   " t.scrollHeight - t.clientHeight]")
    await page.screenshot(path=shots / "queue-1280.png")
    assert overflow == [0, 0], "the state tabs scroll at 1280 px"

    badges: dict[str, set[str]] = {"cancelled": set(), "dead": set(), "failed": set()}

    async def look(url: str, name: str) -> None:
        await page.goto(base + url)
        for state, seen in badges.items():
            for badge in await page.locator(f"span.state:text-is('{state}')").all():
                seen.add(await badge.evaluate(BADGE_STYLE))
        await page.screenshot(path=shots / f"{name}-1280.png", full_page=True)

    await look(f"/tasks/{cancelled.id}", "task-cancelled")
    await look(f"/tasks/{dead.id}", "task-dead")
    await look("/flows", "flows")
    await look(f"/flows/{stopped.id}", "flow-cancelled")
    await look(f"/flows/{failed.id}", "flow-failed")
    await context.close()
    print(f"screenshots in {shots}")

    assert len(badges["cancelled"]) == 1, badges  # one style on every page
    assert all(badges.values()), badges  # each state was seen
    assert badges["cancelled"].isdisjoint(badges["dead"] | badges["failed"]), badges


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def _flow_state(client: obsq.Client, flow: Any, state: str) -> bool:
    return (await client.flows.info(flow.id)).state == state
