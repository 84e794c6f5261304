"""Django's task API on obsq, measured: what `task.enqueue` costs a view (ObsqBackend beside
the SyncClient it enqueues through), and the latency from a transaction's commit to the
start of the task enqueued by its `transaction.on_commit`, through
`obsq worker obsq.django:app` in a process of its own. The shop of examples/django on SQLite
and a private Redis; a report, nothing asserted.

    python tests/bench/django_commit.py [--enqueues 2000] [--commits 300] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django"
HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--enqueues", type=int, default=2000)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(EXAMPLE), str(HERE)]
    from obsq.redis_server import free_port
    from obsq.testing import private_redis

    server = private_redis()
    workdir = Path(tempfile.mkdtemp(prefix="obsq-django-bench-"))
    env = {"DJANGO_SETTINGS_MODULE": "mysite.settings",
           "SHOP_DATABASE": str(workdir / "shop.sqlite3"), "OBSQ_REDIS_URL": server.url,
           "OBSQ_NAMESPACE": "bench"}
    os.environ.update(env)  # this process is the web side: the same settings
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from django_probe import started_after
    from orders.models import Order

    import obsq

    call_command("migrate", run_syncdb=True, verbosity=0)
    # the enqueues before the worker starts: what a view pays, not a worker's competition
    # for the cores; the two ways in alternating rounds, so that drift falls on both
    backend_us, client_us = [], []
    with obsq.SyncClient(server.url, "bench") as client:
        def by_client() -> object:
            return client.enqueue("django:django_probe.started_after", {
                "args": [0.0], "kwargs": {}, "priority": 0, "backend": "default"},
                priority=5, retention=86400.0, max_retry=0)
        for _ in range(10):
            backend_us.append(_per_call(lambda: started_after.enqueue(0.0),
                                        args.enqueues // 10))
            client_us.append(_per_call(by_client, args.enqueues // 10))
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "obsq", "worker", "obsq.django:app", "--concurrency",
         str(args.concurrency), "--http-port", str(port), "--log-level", "warning"],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(
            map(str, (ROOT, EXAMPLE, HERE)))}, cwd=workdir)
    try:
        _ready(port)
        _drain(port, 2 * (args.enqueues // 10) * 10)
        results = []
        for n in range(args.commits):
            with transaction.atomic():
                Order.objects.create(email=f"b{n}@example.com", total_cents=n)
                transaction.on_commit(lambda: results.append(started_after.enqueue(time.time())))
            time.sleep(0.01)  # the worker idle again: latency, not a backlog
        latencies = []
        for result in results:
            while not result.is_finished:
                time.sleep(0.01)
                result.refresh()
            latencies.append(result.return_value * 1000)
        latencies.sort()
        print(f"enqueue, one at a time ({args.enqueues} each, no worker running): "
              f"task.enqueue {statistics.median(backend_us):.0f} us, SyncClient.enqueue of "
              f"the same task {statistics.median(client_us):.0f} us (medians of 10 rounds)")
        print(f"commit to start ({args.commits} commits, a worker of {args.concurrency} "
              f"threads): p50 {statistics.median(latencies):.2f} ms, p99 "
              f"{latencies[int(len(latencies) * 0.99) - 1]:.2f} ms, max {latencies[-1]:.2f} ms")
    finally:
        worker.terminate()
        worker.wait(30)
        server.close()


def _ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the worker did not become ready")


def _per_call(call: object, times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        call()  # type: ignore[operator]
    return (time.perf_counter() - started) / times * 1e6


def _drain(port: int, tasks: int) -> None:
    """Until the worker has run the enqueue measurements' tasks."""
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        done = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("obsq_tasks_processed_total{"))
        if done >= tasks:
            return
        time.sleep(0.1)


if __name__ == "__main__":
    main()
