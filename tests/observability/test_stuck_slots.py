"""Stuck slots as the endpoint shows them: plain handlers that overran their timeout and run
on in their threads, holding their slots, are counted on `/`, in `obsq_worker_stuck_slots`,
fail readiness when every slot is stuck and liveness once one has been stuck longer than the
limit; and it all clears when they return."""

from __future__ import annotations

import asyncio
import threading

from support import wait_until

from .helpers import parse, probe, scrape, value


async def test_stuck_slots_are_counted_and_judged_by_the_probes(app, client, start_worker):
    gate = threading.Event()
    done: list[int] = []

    @app.task("hang", timeout=0.3, max_retry=0)
    def hang(task):
        gate.wait(60)

    @app.task("quick", timeout=5)
    def quick(task):
        done.append(task.payload)

    worker = await start_worker(metrics=True, http_port=0, concurrency=2, stuck_limit=2.0)
    port = start_worker.port(worker)

    async def get(path: str) -> tuple[int, dict]:
        return await asyncio.to_thread(probe, port, path)

    try:
        for _ in range(2):
            await client.enqueue("hang")
        await wait_until(lambda: worker.health().stuck_slots == 2, timeout=20,
                         what="both slots stuck")
        status = (await get("/"))[1]
        assert (status["stuck_slots"], status["pool"], status["busy"]) == (2, "thread", 2)
        assert await get("/readyz") == (503, {
            "status": "unavailable",
            "reason": "every slot is stuck (2 plain handlers overran their timeout)"})
        metrics = parse(await asyncio.to_thread(scrape, port))
        assert value(metrics, "obsq_worker_stuck_slots") == 2

        for n in range(4):  # they wait for a slot
            await client.enqueue("quick", n)

        assert (await get("/healthz"))[0] == 200  # stuck for less than the limit so far
        _, body = await wait_until(
            lambda: _failing(get, "/healthz"), timeout=20,
            what="liveness fails past the stuck limit")
        assert body["reason"].startswith("2 slot(s) stuck in plain handlers that overran "
                                         "their timeout, the longest for ")
        assert body["reason"].endswith("(limit 2 s)")
        assert not done
    finally:
        gate.set()
    await wait_until(lambda: worker.health().stuck_slots == 0, timeout=20)
    await wait_until(lambda: sorted(done) == [0, 1, 2, 3], timeout=20)
    assert (await get("/healthz"))[0] == 200
    assert (await get("/readyz"))[0] == 200
    assert (await get("/"))[1]["stuck_slots"] == 0
    metrics = parse(await asyncio.to_thread(scrape, port))
    assert value(metrics, "obsq_worker_stuck_slots") == 0


async def _failing(get, path: str) -> tuple[int, dict] | None:
    code, body = await get(path)
    return (code, body) if code == 503 else None
