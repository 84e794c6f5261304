"""Flows in the console, in a real chromium: the list of flows, and a flow's page showing its
steps, where it stands and the step that failed it, updated without a reload. Screenshots at
1280x800 under the test's tmp dir (flows.png, flow.png)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import obsq
from obsq import Job, chain, chord


async def test_the_flow_pages(app, client, start_worker, browser, console_process,
                              tmp_path: Path) -> None:
    go, summing = asyncio.Event(), asyncio.Event()

    @app.task("fetch")
    async def fetch(task: obsq.Task):
        return len(task.payload)

    @app.task("sum")
    async def total(task: obsq.Task):
        summing.set()
        await go.wait()  # held running until the page has been seen
        return sum(task.previous)

    @app.task("charge", max_retry=0)
    async def charge(task: obsq.Task):
        raise RuntimeError("card declined <b>")

    await start_worker()
    running = await client.enqueue(chain(chord([Job("fetch", "ab"), Job("fetch", "abc")],
                                               Job("sum")), Job("fetch", "done")))
    failed = await client.enqueue(chain(Job("fetch", "a"), Job("charge"), Job("fetch", "b")))
    with pytest.raises(obsq.FlowFailed):
        await client.result(failed, timeout=20)

    base = console_process()
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})
                  ).new_page()
    await page.goto(base + "/flows")
    await page.get_by_text(failed.id).wait_for()
    rows = page.locator("table.flows tbody tr")
    assert await rows.count() == 2
    assert "card declined <b>" in await page.locator("table.flows").inner_text()  # as text
    await page.screenshot(path=str(tmp_path / "flows.png"), full_page=True)

    await asyncio.wait_for(summing.wait(), 20)  # the callback runs
    await page.goto(f"{base}/flows/{running.id}")
    steps = page.locator("table.steps tbody tr")
    await steps.first.wait_for()
    assert await steps.count() == 4
    texts = [(await steps.nth(i).inner_text()).lower() for i in range(4)]
    assert "completed" in texts[0] and "completed" in texts[1]
    assert "running" in texts[2] and "waiting" in texts[3]
    go.set()  # the page follows the flow to its end by itself
    await page.locator("h1 .state.completed").wait_for(timeout=20_000)
    assert "completed" in (await steps.nth(3).inner_text()).lower()
    await page.screenshot(path=str(tmp_path / "flow.png"), full_page=True)

    await page.goto(f"{base}/flows/{failed.id}")
    assert "step 1" in await page.locator("dl.grid").inner_text()
    assert "RuntimeError: card declined <b>" in await page.locator("section.card p.err"
                                                                   ).inner_text()
    assert await page.locator("tr.failed").count() == 1
    await page.screenshot(path=str(tmp_path / "flow-failed.png"), full_page=True)
    assert httpx.get(f"{base}/flows/nope").status_code == 404
