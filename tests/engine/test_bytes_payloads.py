"""Payloads given as bytes (the user's own serialization: protobuf, msgpack) stay bytes:
written as they are, handed to handlers in several worker processes as the same bytes,
kept apart from JSON with the same text by unique locks, and shown by the Inspector, the
`obsq task` command and the console without being decoded."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import httpx
import pytest
from support import wait_until

import obsq
from obsq import cli
from obsq.broker import QueueKeys
from obsq.inspection.inspector import Inspector
from obsq.ops.ui.app import create_app

SAMPLES = [b"", b"\x00\xff\xfe\x80 not utf-8", b"{}", b'"text"', bytes(range(256)) * 40,
           b"\n".join(os.urandom(8) for _ in range(5))]


async def test_bytes_reach_handlers_in_several_worker_processes_unchanged(
        client, spawn_worker, raw_redis, namespace) -> None:
    workers = [spawn_worker(concurrency=2) for _ in range(3)]

    async def all_up() -> bool:
        return len(await client.broker.workers()) == 3
    await wait_until(all_up, timeout=30, what="three workers")
    infos = [await client.enqueue("blob", sample, retention=300) for sample in SAMPLES * 3]
    infos += await client.enqueue_many([obsq.Job("blob", bytearray(b"bulk %d" % i),
                                                 retention=300) for i in range(30)])
    infos += await client.enqueue_many([obsq.Job("blob", memoryview(b"view"), retention=300)])
    expected = [*SAMPLES * 3, *(b"bulk %d" % i for i in range(30)), b"view"]
    results = await asyncio.gather(*(client.result(info, timeout=60) for info in infos))
    for result, sent in zip(results, expected):
        assert result["kind"] == "bytes" and bytes.fromhex(result["hex"]) == sent
    assert len({r["pid"] for r in results}) >= 2, "the tasks spread over the workers"
    keys = QueueKeys(namespace, "default")
    stored = raw_redis.hgetall(keys.task(infos[1].id))
    # in a field of its own: a worker older than bytes payloads finds no JSON payload and
    # fails the task (dead, requeueable) instead of reading the bytes as JSON
    assert stored[b"bin"] == SAMPLES[1] and b"payload" not in stored
    assert (await client.info(infos[1].id)).payload == SAMPLES[1]
    for worker in workers:
        assert worker.poll() is None


async def test_an_async_handler_gets_bytes_and_a_sync_client_sends_them(
        app, client, start_worker, redis_url, namespace) -> None:
    @app.task("raw")
    async def raw(task: obsq.Task):
        assert isinstance(task.payload, bytes)
        return task.payload.decode("latin-1")

    await start_worker()
    info = await client.enqueue("raw", b"\xe9t\xe9", retention=60)
    assert await client.result(info, timeout=15) == "été"

    def send() -> obsq.TaskInfo:
        with obsq.SyncClient(redis_url, namespace=namespace, app=app) as sync:
            return sync.enqueue("raw", b"\xff", retention=60)
    sent = await asyncio.to_thread(send)
    assert await client.result(sent, timeout=15) == "\xff"


async def test_unique_locks_keep_bytes_and_json_of_the_same_text_apart(client) -> None:
    await client.enqueue("u", {}, unique_for=60)
    await client.enqueue("u", b"{}", unique_for=60)  # not a duplicate of the JSON {}
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("u", b"{}", unique_for=60)
    with pytest.raises(obsq.DuplicateTask):
        await client.enqueue("u", {}, unique_for=60)


async def test_bytes_payloads_are_refused_where_json_is_needed(client, app) -> None:
    with pytest.raises(TypeError, match="bytes cannot be given to a schedule"):
        await client.schedule("nightly", "@every 1h", "blob", b"\x00")
    app.max_payload = 10
    with pytest.raises(obsq.TaskTooLarge):
        await client.enqueue("blob", b"x" * 11)


async def test_the_inspector_the_command_and_the_console_show_bytes(
        client, redis_url, namespace, capsys) -> None:
    payload = bytes(range(200))
    info = await client.enqueue("blob", payload, delay=600)
    inspector = Inspector(redis_url, namespace)
    try:
        detail = await inspector.task(info.id)
        assert detail.payload == payload
        page = await inspector.tasks("default", "scheduled")
        preview = page.tasks[0].payload
        assert preview.startswith("<200 bytes, base64> ")
        assert base64.b64decode(preview.split()[-1].rstrip(".") + "==")[:30] == payload[:30]
    finally:
        await inspector.close()

    code = await asyncio.to_thread(cli.main, ["task", info.id, "--redis-url", redis_url,
                                              "--namespace", namespace])
    out = capsys.readouterr().out
    assert code == 0 and "<200 bytes, base64>" in out
    code = await asyncio.to_thread(cli.main, ["task", info.id, "--json", "--redis-url",
                                              redis_url, "--namespace", namespace])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and base64.b64decode(data["payload"]["base64"]) == payload

    console = create_app(Inspector(redis_url, namespace))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                 base_url="http://console.test") as http:
        task_page = await http.get(f"/tasks/{info.id}")
        queue_page = await http.get("/queues/default?state=scheduled")
    assert task_page.status_code == queue_page.status_code == 200
    assert "&lt;200 bytes, base64&gt;" in task_page.text
    assert "&lt;200 bytes, base64&gt;" in queue_page.text
