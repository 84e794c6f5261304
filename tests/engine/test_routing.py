"""Routing (exact > longest prefix > "*"), the middleware onion, and sync handlers."""

from __future__ import annotations

import asyncio
import threading

import pytest
from support import wait_until

import obsq


def test_route_precedence_exact_then_longest_prefix_then_catch_all() -> None:
    app = obsq.App(namespace="routing")
    handlers = {}
    for pattern in ("*", "report:", "report:pdf:", "report:pdf:big", "mail."):
        def handler(task: obsq.Task, pattern: str = pattern) -> str:
            return pattern
        handlers[pattern] = handler
        app.task(pattern)(handler)

    assert app.route("report:pdf:big").pattern == "report:pdf:big"  # exact
    assert app.route("report:pdf:small").pattern == "report:pdf:"  # longest prefix
    assert app.route("report:csv").pattern == "report:"
    assert app.route("mail.send").pattern == "mail."
    assert app.route("other").pattern == "*"
    assert app.route("report").pattern == "*"  # a prefix needs its separator
    assert app.route("report:pdf:big").handler is handlers["report:pdf:big"]

    bare = obsq.App(namespace="routing")
    bare.task("report:")(lambda task: None)
    assert bare.route("email") is None
    with pytest.raises(ValueError, match="already registered"):
        bare.task("report:")(lambda task: None)


async def test_the_matching_route_runs_end_to_end(app, client, start_worker) -> None:
    ran: dict[str, str] = {}

    def register(pattern: str) -> None:
        @app.task(pattern)
        async def handler(task: obsq.Task) -> None:
            ran[task.type] = f"{pattern} route={task.route}"

    for pattern in ("*", "report:", "report:pdf:", "report:pdf:big"):
        register(pattern)
    await start_worker()
    for task_type in ("report:pdf:big", "report:pdf:a4", "report:csv", "misc"):
        await client.enqueue(task_type)
    await wait_until(lambda: len(ran) == 4)
    assert ran == {
        "report:pdf:big": "report:pdf:big route=report:pdf:big",
        "report:pdf:a4": "report:pdf: route=report:pdf:",
        "report:csv": "report: route=report:",
        "misc": "* route=*",
    }


async def test_middleware_is_an_onion_and_sees_exceptions(app, client, client_without_app,
                                                          start_worker) -> None:
    calls: list[str] = []
    seen: list[str] = []

    @app.use
    async def outer(task: obsq.Task, call_next):
        calls.append(f"outer-in {task.type}")
        try:
            return await call_next(task)
        except Exception as exc:
            seen.append(f"outer saw {type(exc).__name__}: {exc}")
            raise
        finally:
            calls.append(f"outer-out {task.type}")

    @app.use
    async def inner(task: obsq.Task, call_next):
        calls.append(f"inner-in {task.type}")
        result = await call_next(task)
        calls.append(f"inner-out {task.type}")
        return {"wrapped": result}

    @app.task("ok")
    async def ok(task: obsq.Task):
        calls.append("handler ok")
        return 1

    @app.task("boom")
    async def boom(task: obsq.Task):
        calls.append("handler boom")
        raise RuntimeError("kaput")

    await start_worker()
    info = await client.enqueue("ok", retention=60)
    assert await client.result(info, timeout=10) == {"wrapped": 1}
    assert calls == ["outer-in ok", "inner-in ok", "handler ok", "inner-out ok", "outer-out ok"]

    calls.clear()
    failing = await client.enqueue("boom", max_retry=0)
    with pytest.raises(obsq.TaskFailed):
        await client.result(failing, timeout=10)
    # the exception passes through inner (no inner-out) and reaches outer
    assert calls == ["outer-in boom", "inner-in boom", "handler boom", "outer-out boom"]
    assert seen == ["outer saw RuntimeError: kaput"]

    # an unknown type (from a producer without the App) never enters the chain: the worker
    # hands it on for another
    calls.clear()
    unknown = await client_without_app.enqueue("nobody-handles-this", max_retry=0)
    await wait_until(lambda: _state_is(client, unknown.id, "scheduled"), what="handed on")
    assert calls == []


async def test_sync_handler_runs_in_a_thread(app, client, start_worker) -> None:
    loop_thread = threading.get_ident()
    threads: list[tuple[int, str]] = []

    @app.task("sync")
    def sync_handler(task: obsq.Task):
        threads.append((threading.get_ident(), threading.current_thread().name))
        return task.payload * 2

    await start_worker()
    info = await client.enqueue("sync", 21, retention=60)
    assert await client.result(info, timeout=10) == 42
    ident, name = threads[0]
    assert ident != loop_thread
    assert name.startswith("obsq-handler")


async def test_sync_handler_can_retry_in_and_skip_retry(app, client, start_worker) -> None:
    attempts: list[int] = []

    @app.task("later")
    def later(task: obsq.Task):
        attempts.append(task.retry_count)
        if task.retry_count == 0:
            task.retry_in(0.2)
        return "second time"

    @app.task("hopeless")
    def hopeless(task: obsq.Task):
        raise obsq.SkipRetry("bad input")

    await start_worker()
    info = await client.enqueue("later", retention=60)
    hopeless_info = await client.enqueue("hopeless", max_retry=10, retention=60)
    assert await client.result(info, timeout=10) == "second time"
    assert attempts == [0, 1]
    with pytest.raises(obsq.TaskFailed, match="bad input"):
        await client.result(hopeless_info, timeout=10)
    dead = await client.info(hopeless_info.id)
    assert dead.state == "dead"
    assert dead.retry_count == 0
    assert dead.error == "SkipRetry: bad input"


async def test_sync_handler_does_not_block_the_event_loop(app, client, start_worker) -> None:
    """While a sync handler blocks its thread, async handlers keep running."""
    release = threading.Event()
    fast_done = asyncio.Event()

    @app.task("blocking")
    def blocking(task: obsq.Task):
        release.wait(10)

    @app.task("fast")
    async def fast(task: obsq.Task):
        fast_done.set()

    await start_worker(concurrency=4)
    await client.enqueue("blocking")
    await client.enqueue("fast")
    try:
        await asyncio.wait_for(fast_done.wait(), timeout=10)
    finally:
        release.set()


async def _state_is(client: obsq.Client, task_id: str, state: str) -> bool:
    return (await client.info(task_id)).state == state
