"""The console as an operator uses it, in a real chromium: a worker fails tasks, the
operator finds the dead one with its error, opens it, is refused without the token, signs
in, requeues it and watches it complete without reloading the page; a payload crafted to
run script shows as text. Each page is saved as a screenshot at 1280x800 and 375 wide
under the test's tmp dir. The schedules page, with a scheduler firing, likewise."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import wait_until

import obsq

from .phone import fits_a_phone, phone_context

TOKEN = "console-token"
XSS = {"html": "<script>alert('xss-script')</script>",
       "attr": "\"><img src=x onerror=\"alert('xss-img')\">"}
XSS_TYPE = "<img src=x onerror=\"alert('xss-type')\">"


async def test_an_operator_requeues_a_dead_task_and_watches_it_complete(
        app, client, start_worker, browser, console_process, tmp_path: Path) -> None:
    attempts: list[int] = []

    @app.task("charge", max_retry=2)
    async def charge(task: obsq.Task):
        attempts.append(task.retry_count)
        if len(attempts) == 1:
            raise obsq.SkipRetry(f"card declined for order {task.payload['order']}")
        await asyncio.sleep(2)  # long enough to be seen running
        return {"charged": task.payload["amount"]}

    @app.task("report:")
    async def report(task: obsq.Task):
        await task.update_state({"pages": 3})
        return {"pages": 3}

    @app.task("*", max_retry=0)
    async def anything(task: obsq.Task):
        raise ValueError(task.payload["html"])

    await start_worker(queues="billing,reports")
    charge_info = await client.enqueue("charge", {"order": 1042, "amount": 1999},
                                       queue="billing", retention=600)
    xss = await client.enqueue(XSS_TYPE, XSS, queue="billing", headers={"x": XSS["attr"]})
    await client.enqueue_many([obsq.Job("report:daily", {"day": d}, queue="reports",
                                        retention=600) for d in range(12)])
    await client.enqueue_many([obsq.Job("email:send", {"to": f"user{i}@example.com"},
                                        queue="mail") for i in range(7)])
    await client.enqueue("report:monthly", {"month": "2026-12"}, queue="reports", delay=3600)
    for info in (charge_info, xss):
        await wait_until(lambda info=info: _state(client, info.id, "dead"))

    base = console_process("--token", TOKEN, "--trace-url",
                           "https://grafana.example/explore?traceId={trace_id}")
    dialogs: list[str] = []
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.accept())))
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # The overview shows the dead tasks of billing.
    await page.goto(base + "/")
    row = page.locator("tr", has=page.locator("a", has_text="billing"))
    assert await row.locator("a.count.dead").inner_text() == "2"
    await page.screenshot(path=shots / "overview-1280.png")

    # The queue's dead tab lists the failed charge with its error.
    await page.click("text=billing")
    await page.click("nav.tabs >> text=dead")
    await page.wait_for_selector("text=card declined for order 1042")
    await page.screenshot(path=shots / "queue-dead-1280.png", full_page=True)

    # Its page shows everything: error, traceback, payload.
    await page.click(f"a.id:has-text('{charge_info.id}')")
    await page.wait_for_selector("h2:has-text('Last error')")
    assert await page.text_content("span.state") == "dead"
    assert "SkipRetry: card declined for order 1042" in await page.inner_text(".error-card")
    assert "Traceback (most recent call last)" in await page.inner_text("pre.trace")
    assert '"order": 1042' in await page.inner_text("pre.code >> nth=1")
    await page.screenshot(path=shots / "task-dead-1280.png", full_page=True)

    # Without the token: no action buttons, and a forged POST is refused.
    assert await page.locator("button:has-text('Requeue now')").count() == 0
    refused = await page.request.post(f"{base}/tasks/{charge_info.id}/requeue",
                                      form={"queue": "billing"})
    assert refused.status == 403
    assert await _state(client, charge_info.id, "dead")

    # Signing in: a wrong token is refused, the right one leads back to the task.
    await page.click("text=Sign in to act")
    await page.fill("#token", "wrong")
    await page.click("button:has-text('Sign in')")
    await page.wait_for_selector("text=That is not the console's token.")
    await page.fill("#token", TOKEN)
    await page.click("button:has-text('Sign in')")
    await page.wait_for_selector("button:has-text('Requeue now')")

    # Requeue it and watch it run and complete, with no reload of the page.
    await page.evaluate("window.stillThisPage = true")
    await page.click("button:has-text('Requeue now')")
    await page.wait_for_selector("text=moved from dead to pending")
    await page.evaluate("window.stillThisPage = true")
    await page.wait_for_selector("span.state.completed", timeout=20_000)
    assert await page.evaluate("window.stillThisPage") is True
    assert '"charged": 1999' in await page.inner_text("section:has(h2:has-text('Result'))")
    await page.screenshot(path=shots / "task-completed-1280.png", full_page=True)
    assert attempts == [0, 0]

    # A payload, an error, a header and a type crafted to run script: shown as text only.
    for url in (f"/tasks/{xss.id}", "/queues/billing?state=dead", "/"):
        await page.goto(base + url)
        await page.wait_for_timeout(300)
        assert await page.locator("img[src='x']").count() == 0
    await page.goto(f"{base}/tasks/{xss.id}")
    assert XSS["html"] in await page.inner_text("pre.code >> nth=1")
    assert XSS_TYPE in await page.inner_text("h1")
    await page.screenshot(path=shots / "task-xss-1280.png", full_page=True)
    assert [d for d in dialogs if "xss" in d] == []

    await page.goto(base + "/workers")
    await page.wait_for_selector("meter")
    await page.screenshot(path=shots / "workers-1280.png")

    # Readable on a phone.
    phone = await phone_context(browser)
    small = await phone.new_page()
    for name, url in [("overview", "/"), ("queue-dead", "/queues/billing?state=dead"),
                      ("task", f"/tasks/{charge_info.id}"), ("workers", "/workers")]:
        await fits_a_phone(small, base + url, name, shots)
    await phone.close()
    await context.close()
    print(f"screenshots in {shots}")


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def test_the_schedules_page_shows_fires_as_they_happen(
        app, client, start_scheduler, browser, console_process, tmp_path: Path) -> None:
    app.periodic("@every 1s", "heartbeat:ping", name="heartbeat", missed="skip",
                 queue="clock")
    app.periodic("*/15 * * * *", "report:quarter-hour", name="quarter-hour-report")
    await client.schedule("nightly-report", "0 3 * * *", "report:nightly", {"month": "last"},
                          timezone="Europe/Paris", missed="skip", queue="reports")
    await client.schedule("tenant-42-sync", "@every 5m", "account:sync", {"tenant": 42})
    await start_scheduler()
    await wait_until(lambda: _fired(client, "heartbeat", 2))

    base = console_process()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(base + "/")
    await page.click("nav >> text=Schedules")
    await page.wait_for_selector("h2:has-text('4 schedules')")
    row = page.locator("tr", has=page.locator("code.id", has_text="heartbeat"))
    fired = int(await row.locator("td[data-label=Fired]").inner_text())
    assert await row.locator("td[data-label='If missed']").inner_text() == "skip"
    # the page refreshes itself: the count grows without a reload
    await page.evaluate("window.stillThisPage = true")
    await page.wait_for_function(
        "n => Number(document.querySelector(\"tr:has(code.id) td[data-label=Fired]\")"
        ".textContent) > n", arg=fired, timeout=15_000)
    assert await page.evaluate("window.stillThisPage") is True
    nightly = page.locator("tr", has=page.locator("code.id", has_text="nightly-report"))
    assert "Europe/Paris" in await nightly.inner_text()
    assert (await nightly.locator("td[data-label='Next fire']").inner_text()).startswith("in ")
    await page.screenshot(path=shots / "schedules-1280.png", full_page=True)

    phone = await phone_context(browser)
    await fits_a_phone(await phone.new_page(), base + "/schedules", "schedules", shots)
    await phone.close()
    await context.close()
    print(f"screenshots in {shots}")


async def _fired(client: obsq.Client, name: str, at_least: int) -> bool:
    return any(s.name == name and s.fire_count >= at_least for s in await client.schedules())
