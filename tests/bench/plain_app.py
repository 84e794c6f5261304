"""The App of tests/bench/plain.py: plain handlers that do nothing, run by `obsq worker
plain_app:app` from this folder (so any obsq on PYTHONPATH can run it)."""

import obsq

app = obsq.App(namespace="bench-plain")


@app.task("noop")
def noop(task: obsq.Task) -> None:
    """A plain function that returns at once: what a drain of it measures is the worker."""
