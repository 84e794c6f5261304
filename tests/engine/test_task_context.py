"""`task.context` is the user's alone: the engine keeps what it knows of an attempt in
`task._attempt` (AttemptState), so a handler, its middleware and its hooks find only what
they put there, whether the task started at once or waited in the prefetch buffer."""

from __future__ import annotations

from typing import Any

from support import wait_until

import obsq


async def test_the_engine_puts_nothing_in_task_context(app: obsq.App, client: obsq.Client,
                                                       start_worker) -> None:
    seen: list[dict[str, Any]] = []
    told: list[dict[str, Any]] = []

    async def middleware(task: obsq.Task, call_next: obsq.CallNext) -> Any:
        seen.append(dict(task.context))
        task.context["mine"] = task.payload
        return await call_next(task)

    @app.task("job")
    async def job(task: obsq.Task) -> None:
        assert task.context == {"mine": task.payload}

    app.use(middleware)
    app.on_outcome(lambda task, outcome, error: told.append(dict(task.context)))
    await start_worker(concurrency=1)  # most tasks wait in the buffer for the one slot
    await client.enqueue_many([obsq.Job("job", n) for n in range(50)])
    await wait_until(lambda: len(told) == 50)
    assert seen == [{}] * 50
    assert sorted(t["mine"] for t in told) == list(range(50))
    assert all(set(t) == {"mine"} for t in told)
