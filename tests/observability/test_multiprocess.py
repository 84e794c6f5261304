"""`obsq worker --processes 2`: one /metrics for both children (prometheus-client's
multiprocess mode), a child killed with SIGKILL restarted, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from support import ObsqProcess, equal, obsq_env, wait_until

import obsq
from obsq.redis_server import free_port

from .helpers import parse, probe, scrape, value

APP = """
import asyncio, os
import obsq

app = obsq.App(namespace=os.environ["OBSQ_NAMESPACE"])


@app.task("pid")
async def pid(task):
    await asyncio.sleep(0.2)
    return os.getpid()
"""


async def test_two_processes_one_endpoint(redis_url, namespace, tmp_path):
    (tmp_path / "mp_app.py").write_text(APP)
    port = free_port()
    supervisor = ObsqProcess(
        ["worker", "mp_app:app", "--processes", "2", "--concurrency", "2", "--http-port",
         str(port), "--shutdown-timeout", "5"],
        obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace), tmp_path,
        tmp_path / "supervisor.log")
    client = obsq.Client(redis_url, namespace=namespace)
    try:
        async def metrics():
            return parse(await asyncio.to_thread(scrape, port))

        async def up():
            try:
                return value(await metrics(), "obsq_workers") == 2
            except OSError:
                return False
        await wait_until(up, timeout=30, what="two children heartbeating")
        status, page = await asyncio.to_thread(probe, port, "/")
        pids = [p["pid"] for p in page["processes"]]
        assert status == 200 and len(set(pids)) == 2 and all(p["alive"] for p in
                                                             page["processes"])
        assert await asyncio.to_thread(probe, port, "/healthz") == (200, {"status": "ok"})
        assert (await asyncio.to_thread(probe, port, "/readyz"))[0] == 200

        infos = [await client.enqueue("pid", retention=60) for _ in range(20)]
        ran_in = {await client.result(i, timeout=30) for i in infos}
        assert ran_in == set(pids)  # both children worked
        # counted once Redis recorded each attempt, which may come just after the result
        await wait_until(lambda: asyncio.to_thread(lambda: metrics_value(port) == 20),
                         timeout=10, what="20 counted")
        s = await metrics()
        assert value(s, "obsq_task_duration_seconds_count", queue="default", task="pid") == 20
        assert value(s, "obsq_worker_concurrency") == 4  # livesum of 2 x 2 slots
        assert value(s, "obsq_tasks_in_progress", queue="default", task="pid") == 0
        assert value(s, "obsq_build_info", version=obsq.__version__) == 1

        os.kill(pids[0], signal.SIGKILL)

        async def replaced():
            _, page = await asyncio.to_thread(probe, port, "/")
            now = [p["pid"] for p in page["processes"]]
            return pids[0] not in now and all(p["alive"] for p in page["processes"]) and now
        new_pids = await wait_until(replaced, timeout=30, what="the child restarted")
        assert pids[1] in new_pids
        assert (await asyncio.to_thread(probe, port, "/"))[1]["processes"][0]["restarts"] == 1
        await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/healthz")[0] == 200))
        s = await metrics()  # the dead child's counts stay; its live gauges went with it
        assert value(s, "obsq_tasks_processed_total", queue="default", task="pid",
                     outcome="success") == 20

        async def all_done():
            more = [await client.enqueue("pid", retention=60) for _ in range(10)]
            return {await client.result(i, timeout=30) for i in more}
        ran_again = await all_done()
        assert ran_again <= set(new_pids)
        await wait_until(lambda: asyncio.to_thread(lambda: metrics_value(port) == 30),
                         timeout=10, what="30 counted")
        # the replacement counts its slots once it has started its worker: alive as a
        # process (all the page says) comes first, and the other child may have run all ten
        async def slots() -> float:
            return value(await metrics(), "obsq_worker_concurrency")
        assert await wait_until(lambda: equal(slots(), 4), what="the replacement's slots")
    finally:
        await client.close()
        code = await asyncio.to_thread(supervisor.stop, 40)
    log = (tmp_path / "supervisor.log").read_text()
    assert code == 0, log
    assert "exited with signal SIGKILL; restarting it" in log
    assert "Traceback" not in log, log


def metrics_value(port: int) -> float:
    return value(parse(scrape(port)), "obsq_tasks_processed_total", queue="default",
                 task="pid", outcome="success")


async def test_a_single_worker_serving_a_multiprocess_directory_starts_it_afresh(
        redis_url, namespace, tmp_path):
    """As the Helm chart runs it: one process, PROMETHEUS_MULTIPROC_DIR set. A previous
    run's files (a restarted container keeps its emptyDir, and reuses pids) are cleared."""
    (tmp_path / "mp_app.py").write_text(APP)
    directory = tmp_path / "prom"
    directory.mkdir()
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                   PROMETHEUS_MULTIPROC_DIR=str(directory))
    stale = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", (
        "from prometheus_client import Counter; "
        "Counter('obsq_stale', 'a previous run', ['x']).labels('y').inc(5)")],
        env=env, capture_output=True, text=True, timeout=30)
    assert stale.returncode == 0, stale.stderr
    assert list(directory.glob("counter_*.db"))
    port = free_port()
    worker = ObsqProcess(["worker", "mp_app:app", "--http-port", str(port)], env, tmp_path,
                        tmp_path / "worker.log")
    client = obsq.Client(redis_url, namespace=namespace)
    try:
        async def up():
            try:
                return value(parse(await asyncio.to_thread(scrape, port)), "obsq_workers") == 1
            except OSError:
                return False
        await wait_until(up, timeout=30, what="the worker serving")
        for _ in range(3):
            await client.result(await client.enqueue("pid", retention=60), timeout=30)
        async def all_counted():  # counted once Redis recorded each, after the result
            s = parse(await asyncio.to_thread(scrape, port))
            return s if value(s, "obsq_tasks_processed_total", queue="default", task="pid",
                              outcome="success") == 3 else None
        s = await wait_until(all_counted, what="3 successes counted")
        assert not [name for name, _ in s if name.startswith("obsq_stale")]
        assert value(s, "obsq_worker_concurrency") == 50
    finally:
        await client.close()
        code = await asyncio.to_thread(worker.stop)
    assert code == 0, (tmp_path / "worker.log").read_text()


def test_a_scrape_skips_the_file_a_starting_process_has_not_written_yet(tmp_path):
    """A restarted child creates its value file empty and sizes it a moment later; a scrape
    in between must serve the other files, not fail on that one."""
    directory = tmp_path / "prom"
    directory.mkdir()
    env = obsq_env(PROMETHEUS_MULTIPROC_DIR=str(directory))
    script = ("from prometheus_client import Counter; "
              "Counter('obsq_written', 'a process that wrote', ['x']).labels('y').inc(5); "
              "open(__import__('os').path.join(__import__('os').environ"
              "['PROMETHEUS_MULTIPROC_DIR'], 'counter_99999.db'), 'wb').close(); "
              "from prometheus_client import generate_latest; "
              "from obsq.observability.metrics import endpoint_registry; "
              "print(generate_latest(endpoint_registry()).decode())")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'obsq_written_total{x="y"} 5.0' in out.stdout


async def test_a_pod_left_without_queue_gauges_serves_none(redis_url, namespace, tmp_path):
    # The chart's workers with an exporter beside them (OBSQ_QUEUE_METRICS=false): the
    # supervisor's endpoint has the children's metrics and no queue-wide gauge.
    (tmp_path / "mp_app.py").write_text(APP)
    port = free_port()
    supervisor = ObsqProcess(
        ["worker", "mp_app:app", "--processes", "2", "--concurrency", "2", "--http-port",
         str(port)],
        obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                 OBSQ_QUEUE_METRICS="false"), tmp_path, tmp_path / "supervisor.log")
    try:
        async def both_children() -> bool:
            try:
                return value(parse(await asyncio.to_thread(scrape, port)),
                             "obsq_worker_concurrency") == 4
            except OSError:
                return False
        await wait_until(both_children, timeout=30, what="two children serving")
        names = {name for name, _ in parse(await asyncio.to_thread(scrape, port))}
        assert "obsq_build_info" in names
        assert not {n for n in names if n.startswith("obsq_queue_") or n == "obsq_workers"}
    finally:
        code = await asyncio.to_thread(supervisor.stop, 40)
    assert code == 0, (tmp_path / "supervisor.log").read_text()


BLOCKING_APP = """
import os, pathlib, time
import obsq

app = obsq.App(namespace=os.environ["OBSQ_NAMESPACE"])
MARK = pathlib.Path(os.environ["BLOCK_MARK"])


@app.task("block")
async def block(task):
    if not MARK.exists():  # the first run blocks the event loop for good
        MARK.touch()
        time.sleep(600)
    return os.getpid()
"""


async def test_a_child_whose_event_loop_stays_blocked_is_replaced(redis_url, namespace,
                                                                  tmp_path):
    """The pod's /healthz sees only that its children run: a child judges its own liveness
    as a single worker's probe would, and ends; the supervisor starts another."""
    (tmp_path / "block_app.py").write_text(BLOCKING_APP)
    port = free_port()
    supervisor = ObsqProcess(
        ["worker", "block_app:app", "--processes", "2", "--http-port", str(port),
         "--shutdown-timeout", "5"],
        obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                 OBSQ_BLOCKED_LOOP_LIMIT="2", OBSQ_HEARTBEAT_TTL="3",
                 OBSQ_HEARTBEAT_INTERVAL="0.5", BLOCK_MARK=str(tmp_path / "blocked")),
        tmp_path, tmp_path / "supervisor.log")
    client = obsq.Client(redis_url, namespace=namespace)
    try:
        async def up():
            try:
                return value(parse(await asyncio.to_thread(scrape, port)), "obsq_workers") == 2
            except OSError:
                return False
        await wait_until(up, timeout=30, what="two children heartbeating")
        info = await client.enqueue("block")
        # the blocked child ends, its task runs again once its heartbeat lapses
        assert await client.result(info, timeout=60)
        log = supervisor.log()
        assert "the event loop has been blocked for" in log
        assert "this process ends, and the supervisor starts another" in log
        assert "exited with status 1; restarting it" in log
        await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/healthz")[0] == 200),
                         timeout=30, what="both children running again")
    finally:
        await client.close()
        await asyncio.to_thread(supervisor.stop, 40)
