"""What the console answers, in a real chromium and to a script: the overview's running
count agrees with the workers' busy slots, "Sign in to act" leads back to a task whose id
has characters that URLs escape, and a script with a wrong bearer token gets JSON."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from support import wait_until

import obsq
from obsq.engine import fetching

TOKEN = "console-token"
# ids as producers choose them: a path, a query, a fragment, a percent sign, a space, a plus
ODD_IDS = ["order 42/refund?x=1&y=%20#3", "a+b %2F c"]


async def test_the_overview_runs_what_the_workers_run(app, client, start_worker, browser,
                                                     console_process, tmp_path: Path,
                                                     monkeypatch) -> None:
    """A worker with 2 slots leases 4 tasks (after short tasks it fetches ahead): 2 run, 2
    wait in the worker (kept there for the test: it would hand them back after a second
    of hung handlers). The overview says 2 running of 2 slots, as the worker row says
    2/2, and names the other 2 as leased."""
    monkeypatch.setattr(fetching, "BUFFER_HOLD", 600.0)
    release = asyncio.Event()

    @app.task("hold")
    async def hold(task: obsq.Task) -> None:
        await release.wait()

    @app.task("quick")
    async def quick(task: obsq.Task) -> None:
        return None

    worker = await start_worker(concurrency=2)
    try:
        await client.enqueue_many([obsq.Job("quick", i) for i in range(40)])
        await wait_until(lambda: worker.processed >= 40, what="the short tasks")
        await client.enqueue_many([obsq.Job("hold", i) for i in range(4)])
        base = console_process()
        page = await (await browser.new_context(viewport={"width": 1280, "height": 800})
                      ).new_page()

        async def shown() -> bool:
            await page.goto(base + "/")
            tile = await page.inner_text(".tile:has(.label:text-is('Running'))")
            return tile.split()[1] == "2" and "more leased" in tile
        deadline = asyncio.get_running_loop().time() + 20
        while not await shown():  # the heartbeat carries the busy count every 0.5 s
            assert asyncio.get_running_loop().time() < deadline, await page.content()
            await asyncio.sleep(0.3)
        tile = await page.inner_text(".tile:has(.label:text-is('Running'))")
        assert re.search(r"^Running\s+2\s+of 2 slots · 2 more leased$", tile), tile
        assert worker.busy == 2
        await page.goto(base + "/workers")
        assert "2/2" in await page.inner_text("td[data-label='Busy']")
        await page.goto(base + "/")
        await page.screenshot(path=tmp_path / "overview-running.png")
    finally:
        release.set()


@pytest.mark.parametrize("odd_id", ODD_IDS)
async def test_sign_in_to_act_returns_to_a_task_whose_id_urls_escape(
        client, browser, console_process, tmp_path: Path, odd_id: str) -> None:
    await client.enqueue("hold", 1, queue="odd:queue", task_id=odd_id, delay=3600,
                         retention=600)
    base = console_process("--token", TOKEN)
    page = await (await browser.new_context(viewport={"width": 1280, "height": 800})
                  ).new_page()
    await page.goto(f"{base}/tasks/{quote(odd_id, safe='')}?queue={quote('odd:queue')}")
    await page.screenshot(path=tmp_path / "task-before-sign-in.png")
    assert await page.inner_text("dd code.id") == odd_id
    await page.click("text=Sign in to act")
    await page.fill("#token", TOKEN)
    await page.click("button:has-text('Sign in')")
    await page.wait_for_selector("button:has-text('Requeue now')", timeout=10_000)
    assert await page.inner_text("dd code.id") == odd_id
    await page.screenshot(path=tmp_path / "task-after-sign-in.png")
    await page.click("button:has-text('Requeue now')")
    await page.wait_for_selector("text=moved from scheduled to pending")
    assert await page.inner_text("dd code.id") == odd_id  # back on the task's own page
    assert (await client.info(odd_id)).state == "pending"


async def test_a_wrong_bearer_token_gets_json(client, console_process) -> None:
    info = await client.enqueue("t", 1, delay=3600)
    base = console_process("--token", TOKEN)
    async with httpx.AsyncClient(base_url=base) as http:
        for authorization in ("Bearer wrong", "Basic Zm9vOmJhcg==", "Bearer"):
            refused = await http.post(f"/tasks/{info.id}/delete",
                                      headers={"authorization": authorization})
            assert refused.status_code == 403
            assert refused.headers["content-type"] == "application/json"
            assert refused.json() == {"status": "error", "message":
                                      "The bearer token is not the console's token."}
        read_only = console_process("--token", TOKEN, "--read-only")
        refused = await http.post(f"{read_only}/tasks/{info.id}/delete",
                                  headers={"authorization": f"Bearer {TOKEN}"})
        assert refused.status_code == 403 and refused.json()["status"] == "error"
        assert "read-only" in refused.json()["message"]
        done = await http.post(f"/tasks/{info.id}/delete",
                               headers={"authorization": f"Bearer {TOKEN}"})
        assert done.json()["status"] == "ok"
