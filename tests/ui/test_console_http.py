"""The console over HTTP (in process, against a real Redis and a real worker): escaping,
the security headers, who may act and how, probes, and the pages' content."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from support import wait_for, wait_until

import obsq
from obsq.inspection.inspector import Inspector
from obsq.ops.ui import auth as ui_auth
from obsq.ops.ui import create_app
from obsq.redis_server import free_port

TOKEN = "s3cret-token"
XSS_PAYLOAD = {"html": "<script>window.__xss = 1</script>",
               "attr": "\"><img src=x onerror=\"window.__xss = 2\">"}


@pytest.fixture
async def console(redis_url: str, namespace: str) -> AsyncIterator[httpx.AsyncClient]:
    async with _console(redis_url, namespace, token=TOKEN) as http:
        yield http


def _console(redis_url: str, namespace: str, **options) -> httpx.AsyncClient:
    app = create_app(Inspector(redis_url, namespace), **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                             base_url="http://console.test")


async def sign_in(http: httpx.AsyncClient) -> str:
    """Sign in with the token; returns the CSRF token of the session."""
    response = await http.post("/login", data={"token": TOKEN, "next": "/"})
    assert response.status_code == 303
    page = await http.get("/")
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page.text).group(1)


async def test_every_value_is_rendered_as_text(app, client, start_worker, console) -> None:
    @app.task("*", max_retry=0)
    async def fail(task: obsq.Task):
        raise ValueError(task.payload["html"])

    await start_worker(queues="q<b>")
    info = await client.enqueue('<img src=x onerror="window.__xss = 3">', XSS_PAYLOAD,
                                queue="q<b>", headers={"note": "<svg onload=alert(4)>"})
    await wait_until(lambda: _state(client, info.id, "dead"))
    for url in ["/", "/queues/q%3Cb%3E?state=dead", f"/tasks/{info.id}", "/workers"]:
        body = (await console.get(url)).text
        assert "<script>window" not in body and "<img src=x" not in body, url
        assert "<svg onload" not in body and "<b>" not in body, url
    body = (await console.get(f"/tasks/{info.id}")).text
    assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in body  # payload and error
    assert "&#34;&gt;&lt;img src=x onerror=" in body
    assert "&lt;svg onload=alert(4)&gt;" in body


async def test_pages_carry_a_content_security_policy(client, console) -> None:
    info = await client.enqueue("t", {"a": 1})
    for url in ["/", "/queues/default", f"/tasks/{info.id}", "/workers", "/schedules",
                "/login", "/static/console.css", "/queues/nope"]:
        response = await console.get(url)
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp, url
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
    page = (await console.get("/")).text
    assert "<script>" not in page and " on" + "click=" not in page
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/console.js" defer>']


async def test_actions_need_a_post_with_the_csrf_token_of_a_session(client, console,
                                                                    raw_redis,
                                                                    namespace) -> None:
    await client.enqueue("t", queue="mail")
    paused = f"{namespace}:{{mail}}:paused"
    assert (await console.get("/queues/mail/pause")).status_code == 405  # never by GET
    assert (await console.post("/queues/mail/pause")).status_code == 403  # not signed in
    refused = await console.post("/login", data={"token": "wrong"})
    assert refused.status_code == 403 and "not the console" in refused.text
    csrf = await sign_in(console)
    assert (await console.post("/queues/mail/pause")).status_code == 403  # no CSRF token
    assert (await console.post("/queues/mail/pause", data={"csrf": "0" * 64})).status_code \
        == 403
    other_site = await console.post("/queues/mail/pause", data={"csrf": csrf},
                                    headers={"origin": "https://evil.example"})
    assert other_site.status_code == 403
    assert not raw_redis.exists(paused)

    done = await console.post("/queues/mail/pause", data={"csrf": csrf})
    assert done.status_code == 303 and done.headers["location"] == "http://console.test/queues/mail"
    assert raw_redis.exists(paused)
    page = await console.get("/queues/mail")
    assert "Queue mail paused." in page.text and "Resume queue" in page.text

    console.cookies.clear()  # a script with the token as a bearer needs no session
    assert (await console.post("/queues/mail/unpause",
                               headers={"authorization": "Bearer nope"})).status_code == 403
    bearer = {"authorization": f"Bearer {TOKEN}"}
    done = await console.post("/queues/mail/unpause", headers=bearer)
    assert done.status_code == 200 and not raw_redis.exists(paused)
    assert done.json() == {"status": "ok", "message": "Queue mail unpaused."}
    # a script is told by the status when an action is refused, not sent to a page
    for path, data, status in (("/queues/nosuch/pause", None, 404),
                               ("/tasks/nosuch/cancel", None, 404),
                               ("/queues/mail/purge", {"state": "bogus"}, 400)):
        refused = await console.post(path, data=data, headers=bearer)
        assert refused.status_code == status, (path, refused.text)
        assert refused.json()["status"] == "error" and refused.json()["message"]


async def test_the_token_is_compared_in_constant_time(console, monkeypatch) -> None:
    compared = []
    real = ui_auth.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(ui_auth.hmac, "compare_digest", spy)
    await console.post("/login", data={"token": "guess"})
    assert (b"guess", TOKEN.encode()) in compared


async def test_without_a_token_the_console_only_shows(client, redis_url, namespace,
                                                      raw_redis) -> None:
    await client.enqueue("t", queue="mail")
    for options in ({}, {"token": TOKEN, "read_only": True}):
        async with _console(redis_url, namespace, **options) as http:
            page = await http.get("/queues/mail")
            assert "read-only" in page.text and "Pause queue" not in page.text
            assert (await http.post("/login", data={"token": TOKEN})).status_code == 403
            refused = await http.post("/queues/mail/pause",
                                      headers={"authorization": f"Bearer {TOKEN}"})
            assert refused.status_code == 403 and "read-only" in refused.text
    assert not raw_redis.exists(f"{namespace}:{{mail}}:paused")


async def test_requeue_and_delete_from_the_task_page(client, console, raw_redis,
                                                     namespace) -> None:
    info = await client.enqueue("t", 1, delay=600)
    csrf = await sign_in(console)
    page = await console.get(f"/tasks/{info.id}")
    assert "Requeue now" in page.text and "scheduled" in page.text
    done = await console.post(f"/tasks/{info.id}/requeue",
                              data={"csrf": csrf, "queue": "default"})
    # kept for no retention, it is gone once it runs: the console goes on to its queue
    assert done.status_code == 303
    assert done.headers["location"] == "http://console.test/queues/default?state=pending"
    page = await console.get(done.headers["location"])
    assert f"Task {info.id} moved from scheduled to pending." in page.text
    again = await console.post(f"/tasks/{info.id}/requeue", data={"csrf": csrf})
    page = await console.get(again.headers["location"])
    assert "it cannot be requeued" in page.text
    done = await console.post(f"/tasks/{info.id}/delete",
                              data={"csrf": csrf, "next": "/queues/default?state=pending"})
    assert done.headers["location"] == "/queues/default?state=pending"
    assert "deleted (it was pending)" in (await console.get(done.headers["location"])).text
    assert not raw_redis.exists(f"{namespace}:{{default}}:t:{info.id}")
    away = await console.post(f"/tasks/{info.id}/delete",
                              data={"csrf": csrf, "next": "//evil.example/"})
    assert away.headers["location"].startswith("http://console.test/tasks/")


async def test_pages_live_fragments_search_and_trace_links(client, redis_url,
                                                           namespace) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    info = await client.enqueue("t", queue="mail", headers={
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    plain = await client.enqueue("t", queue="mail", headers={"traceparent": "junk"})
    async with _console(redis_url, namespace,
                        trace_url="https://grafana.example/explore?trace={trace_id}") as http:
        page = await http.get(f"/tasks/{info.id}")
        assert f'href="https://grafana.example/explore?trace={trace_id}"' in page.text
        assert "View trace" not in (await http.get(f"/tasks/{plain.id}")).text
        fragment = await http.get("/", headers={"x-obsq-fragment": "1"})
        assert "<html" not in fragment.text and "mail" in fragment.text
        found = await http.get(f"/search?id={info.id}")
        assert found.status_code == 303 and f"/tasks/{info.id}?queue=mail" in \
            found.headers["location"]
        assert (await http.get("/search?id=nope")).status_code == 404
        missing = await http.get("/queues/nope")
        assert missing.status_code == 404 and "no queue &#39;nope&#39;" in missing.text
        assert (await http.get("/queues/mail?state=sleeping")).status_code == 400
        assert (await http.get("/queues/mail?offset=-3")).status_code == 400
        listed = await http.get("/queues/mail?state=pending&type=t")
        assert info.id in listed.text and plain.id in listed.text


async def test_metrics_and_probes(client, console, namespace) -> None:
    await client.enqueue("t", queue="mail")
    assert (await console.get("/healthz")).json() == {"status": "ok"}
    assert (await console.get("/readyz")).json() == {"status": "ok"}
    metrics = (await console.get("/metrics")).text
    assert 'obsq_queue_depth{queue="mail",state="pending"} 1.0' in metrics
    async with _console(f"redis://127.0.0.1:{free_port()}/0", namespace) as away:
        ready = await away.get("/readyz")
        assert ready.status_code == 503 and "Redis" in ready.json()["reason"]
        page = await away.get("/")
        assert page.status_code == 503 and "Redis is unreachable" in page.text


async def test_the_schedules_page_lists_entries_with_next_and_last_fire(
        app, client, console, start_scheduler, raw_redis, namespace) -> None:
    page = await console.get("/schedules")
    assert "No schedules in namespace" in page.text and 'aria-current="page"' in page.text
    app.periodic("@every 0.5s", "tick", name="ticker", missed="skip", queue="clock")
    await client.schedule("nightly", "0 3 * * *", "report:nightly", timezone="Europe/Paris")
    await client.schedule("<b>x</b>", "@every 1h", '<img src=x onerror="alert(1)">')
    await client.schedule("broken", "@every 1h", "t")
    raw_redis.hset(f"{namespace}:{{schedules}}:entries", "broken", "[]")
    await start_scheduler()
    await wait_until(lambda: _fired(client, "ticker"))
    page = (await console.get("/schedules")).text
    assert "4 schedules" in page
    row = re.search(r"<tr>\s*<td data-label=\"Schedule\" class=\"name\"><span><code class="
                    r"\"id\">ticker</code>.*?</tr>", page, re.S).group(0)
    assert "<code>@every 0.5s</code>" in row and 'href="/queues/clock"' in row
    assert ">skip<" in row and "ago<" in row and ">code<" in row  # last fire: "…s ago"
    nightly = re.search(r"<code class=\"id\">nightly</code>.*?</tr>", page, re.S).group(0)
    assert "Europe/Paris" in nightly and ">run once<" in nightly and ">never<" in nightly
    assert ">in " in nightly and ">runtime<" in nightly  # next fire: "in …h"
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "<img src=x" not in page
    assert "schedule &#39;broken&#39; in Redis is not valid" in page
    fragment = await console.get("/schedules", headers={"x-obsq-fragment": "1"})
    assert "<html" not in fragment.text and "nightly" in fragment.text


async def _fired(client: obsq.Client, name: str) -> bool:
    return any(s.name == name and s.fire_count for s in await client.schedules())


async def _state(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state


async def test_obsq_ui_reports_a_taken_port_and_a_bad_trace_url_in_one_line(
        redis_url, namespace, caplog) -> None:
    import asyncio
    import socket

    from obsq import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = await asyncio.to_thread(cli.main, ["ui", "--redis-url", redis_url, "--namespace",
                                                  namespace, "--http-port", str(port)])
    assert code == 1
    assert f"obsq ui: cannot listen on 127.0.0.1:{port}" in caplog.text
    code = await asyncio.to_thread(cli.main, ["ui", "--redis-url", redis_url, "--http-port", "0",
                                              "--trace-url", "javascript:alert(1)//{trace_id}"])
    assert code == 2 and "--trace-url must be an http(s) URL" in caplog.text


def test_obsq_ui_stops_with_status_0_on_sigterm(redis_url, namespace, tmp_path) -> None:
    """As every obsq process under Kubernetes: a SIGTERM is a clean stop, not a kill."""
    port = free_port()
    log = (tmp_path / "ui.log").open("w")
    ui = subprocess.Popen([sys.executable, "-m", "obsq", "ui", "--redis-url", redis_url,
                           "--namespace", namespace, "--http-port", str(port)],
                          stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
                 timeout=20, what="obsq ui answering /healthz")
    finally:
        ui.send_signal(signal.SIGTERM)
        code = ui.wait(timeout=20)
        log.close()
    assert code == 0, (tmp_path / "ui.log").read_text()


async def test_grouped_tasks_and_subscribers_show(app, client, console,
                                                  start_worker) -> None:
    @app.subscribe("order.created", name="billing", queue="mail")
    async def billing(task: obsq.Task) -> None:
        return None

    app.aggregate("rows:", lambda group, tasks: ("rows:sum", len(tasks)), max_delay=600,
                  grace_period=600)
    await start_worker(queues="mail")
    workers = (await console.get("/workers")).text
    assert "events: order.created@billing" in workers
    info = await client.enqueue("rows:add", 1, queue="mail", group="sensor-1")
    page = (await console.get("/")).text
    assert "Aggregating</th>" in page
    assert re.search(r'data-label="Aggregating"><a class="count aggregating" '
                     r'href="/queues/mail#groups">1</a>', page)
    assert "1 in groups · 0 due later" in page
    task = (await console.get(f"/tasks/{info.id}")).text
    assert "aggregating" in task
    metrics = (await console.get("/metrics")).text
    assert 'obsq_queue_depth{queue="mail",state="aggregating"} 1.0' in metrics


async def test_the_queue_page_shows_groups_and_failing_batches(app, client, console,
                                                               start_worker) -> None:
    hostile = "<img/src=x/onerror=alert(1)>"

    async def store_down(group: str, tasks: list[obsq.Task]):
        raise RuntimeError(f"<script>window.__xss = {len(tasks)}</script>")

    app.aggregate("rows:", store_down, max_size=2, max_delay=600, grace_period=600)
    ids = [(await client.enqueue("rows:add", n, queue="mail", group=hostile)).id
           for n in range(2)]
    waiting = [(await client.enqueue("rows:add", n, queue="mail", group=f"g{n:02d}")).id
               for n in range(30)]
    await start_worker(queues="mail")
    await wait_until(lambda: _batch_failed(console))
    body = (await console.get("/queues/mail")).text
    assert "<script>window" not in body and "<img/src" not in body
    assert "&lt;script&gt;window.__xss = 2&lt;/script&gt;" in body  # the aggregator's error
    assert 'id="groups"' in body and "30 waiting for their aggregator" in body
    assert "1 claimed or failing" in body and "1\u201325 of 30" in body
    assert "goffset=25" in body
    second = (await console.get("/queues/mail?goffset=25")).text
    assert "26\u201330 of 30" in second and ">g29</a>" in second and ">g00</a>" not in second

    link = re.search(r'href="(/queues/mail/group\?type=rows%3Aadd&amp;group=g00)"', body)
    group = (await console.get(link.group(1).replace("&amp;", "&"))).text
    assert waiting[0] in group and "1 of 1 waiting in the group" in group
    claimed = (await console.get("/queues/mail/group", params={"type": "rows:add",
                                                                "group": hostile})).text
    assert "<img/src" not in claimed and "&lt;img/src=x/onerror=alert(1)&gt;" in claimed
    assert not any(i in claimed for i in ids)  # in their batch now, not in the group
    missing = await console.get("/queues/mail/group", params={"type": "rows:add"})
    assert missing.status_code == 400
    assert (await console.get("/queues/nosuch/group?type=a&group=b")).status_code == 404


async def _batch_failed(console: httpx.AsyncClient) -> bool:
    return "&lt;script&gt;window.__xss" in (await console.get("/queues/mail")).text


async def test_the_queue_page_lists_what_counts_as_pending_and_the_current_partitions(
        client, redis_url, namespace, raw_redis) -> None:
    """Tasks behind an ordering key are in the pending list; a partitioned queue shows the
    count its workers declared, and a partition of an earlier count only while it holds
    tasks, marked."""
    from obsq.names import partition_names

    keyed = [await client.enqueue("t", i, queue="flat", ordering_key="k1") for i in range(3)]
    earlier, now = partition_names("events", 4), partition_names("events", 2)
    for count in (4, 2):
        raw_redis.hset(f"{namespace}:partitions", "events", count)  # as its workers write it
        async with obsq.Client(redis_url, namespace) as producer:
            await producer.enqueue_many([obsq.Job("ev", i, queue="events") for i in range(40)])
    async with Inspector(redis_url, namespace) as inspector:
        for name in earlier[1:]:
            await inspector.purge(name, "pending")
    async with _console(redis_url, namespace) as http:
        body = (await http.get("/queues/flat?state=pending")).text
        assert all(info.id in body for info in keyed)
        body = (await http.get("/queues/events")).text
        assert "2 partitions" in body and "earlier count, draining" in body
        assert all(name in body for name in (*now, earlier[0]))
        assert not any(name in body for name in earlier[1:])


async def test_a_debounced_task_shows_its_key_while_it_waits(client, console) -> None:
    info = await client.enqueue("index:doc", 1, debounce_key="doc-42", debounce=60)
    page = (await console.get(f"/tasks/{info.id}")).text
    assert "Debounce key" in page and "<code>doc-42</code>" in page and "scheduled" in page
