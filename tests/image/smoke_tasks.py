"""The task application of the image smoke test (see smoke.py): one async handler and one
plain function, which the worker runs in its thread pool."""

import obsq

app = obsq.App(namespace="obsq-smoke")


@app.task("smoke:add")
async def add(task: obsq.Task) -> int:
    return sum(task.payload)


@app.task("smoke:upper")
def upper(task: obsq.Task) -> str:
    return task.payload.upper()
