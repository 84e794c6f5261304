"""The App of tests/bench/outbox.py: each task returns when its handler started."""

import time

import obsq

app = obsq.App()


@app.task("outbox:bench")
async def started(task: obsq.Task) -> float:
    return time.time()
