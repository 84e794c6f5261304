"""The App of the outbox's process tests: its handler returns its payload."""

import obsq

app = obsq.App()


@app.task("echo")
async def echo(task: obsq.Task) -> object:
    return task.payload
