"""`obsq scheduler` serves /healthz and /readyz for its probes, and /metrics with its
fires and missed fires per schedule entry."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import redis
from support import ObsqProcess, obsq_env, wait_until

import obsq
from obsq.redis_server import free_port

from .helpers import parse, pick, probe, scrape, value, wait_ready


def write_app(folder: Path, namespace: str) -> None:
    (folder / "schedapp.py").write_text(textwrap.dedent(f"""
        import obsq

        app = obsq.App(namespace={namespace!r})
        app.periodic("@every 1s", "tick")
    """))


async def test_scheduler_probes_follow_redis(private_redis, namespace, tmp_path):
    write_app(tmp_path, namespace)
    port = free_port()
    log = tmp_path / "scheduler.log"
    scheduler = ObsqProcess(["scheduler", "schedapp:app", "--http-port", str(port)],
                           obsq_env(OBSQ_REDIS_URL=private_redis.url), tmp_path, log)
    try:
        assert await wait_ready(port) == {"status": "ok"}
        assert await asyncio.to_thread(probe, port, "/healthz") == (200, {"status": "ok"})
        status, body = await asyncio.to_thread(probe, port, "/")
        assert status == 200 and body["namespace"] == namespace
        assert body["app_schedules"] == 1
        # it schedules as before
        r = redis.Redis.from_url(private_redis.url)
        try:
            await wait_until(lambda: asyncio.to_thread(
                lambda: any(r.scan_iter(match=f"{namespace}:*:t:tick@*"))), timeout=10,
                what="a periodic task enqueued")
        finally:
            r.close()

        private_redis.stop()
        _, body = await wait_until(
            lambda: asyncio.to_thread(lambda: (p := probe(port, "/readyz"))[0] == 503 and p),
            timeout=15, what="readyz 503")
        assert body == {"status": "unavailable", "reason": "Redis is unreachable"}
        # an outage is no reason to restart the pod: liveness stays up
        assert (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200

        private_redis.start()
        await wait_until(lambda: asyncio.to_thread(lambda: probe(port, "/readyz")[0] == 200),
                         timeout=15, what="readyz 200 again")
    finally:
        code = await asyncio.to_thread(scheduler.stop)
    assert code == 0, log.read_text()


async def test_scheduler_port_from_the_environment_and_off(redis_url, namespace, tmp_path):
    write_app(tmp_path, namespace)
    port = free_port()
    log = tmp_path / "scheduler.log"
    scheduler = ObsqProcess(["scheduler", "schedapp:app"],
                           obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_HTTP_PORT=str(port)),
                           tmp_path, log)
    try:
        assert await wait_ready(port) == {"status": "ok"}
    finally:
        assert await asyncio.to_thread(scheduler.stop) == 0, log.read_text()

    off = ObsqProcess(["scheduler", "schedapp:app", "--http-port", "-1"],
                     obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_HTTP_PORT=str(port)),
                     tmp_path, log)
    try:
        await wait_until(lambda: "scheduler started" in log.read_text().split(
            "scheduler stopped")[-1], timeout=20, what="second scheduler started")
        assert "metrics and probes on" not in log.read_text().split("scheduler stopped")[-1]
    finally:
        assert await asyncio.to_thread(off.stop) == 0, log.read_text()


async def test_scheduler_takes_its_namespace_from_the_environment(redis_url, namespace,
                                                                  tmp_path):
    """As the chart runs it: a plain App() and OBSQ_NAMESPACE, like the workers."""
    (tmp_path / "plainapp.py").write_text(textwrap.dedent("""
        import obsq

        app = obsq.App()
        app.periodic("@every 1s", "tick")
    """))
    log = tmp_path / "scheduler.log"
    scheduler = ObsqProcess(["scheduler", "plainapp:app"],
                           obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                                    OBSQ_HTTP_PORT="-1"), tmp_path, log)
    r = redis.Redis.from_url(redis_url)
    try:
        await wait_until(lambda: asyncio.to_thread(
            lambda: any(r.scan_iter(match=f"{namespace}:*:t:tick@*"))), timeout=15,
            what="a periodic task enqueued in the namespace of OBSQ_NAMESPACE")
    finally:
        r.close()
        code = await asyncio.to_thread(scheduler.stop)
    assert code == 0, log.read_text()


async def test_scheduler_metrics_count_fires_per_entry(redis_url, namespace, tmp_path):
    """The App's entry is exported at 0 from the first scrape, an entry added at run time
    as soon as the scheduler reads it, and a removed entry's series go with it."""
    (tmp_path / "slowapp.py").write_text(textwrap.dedent(f"""
        import obsq

        app = obsq.App(namespace={namespace!r})
        app.periodic("0 3 * * *", "report:nightly", timezone="Europe/Paris")
    """))
    port = free_port()
    log = tmp_path / "scheduler.log"
    scheduler = ObsqProcess(["scheduler", "slowapp:app", "--http-port", str(port)],
                            obsq_env(OBSQ_REDIS_URL=redis_url), tmp_path, log)
    fires = "obsq_scheduler_fires_total"

    async def samples() -> dict:
        return parse(await asyncio.to_thread(scrape, port))

    try:
        await wait_ready(port)
        assert pick(await samples(), fires) == {(("entry", "report:nightly"),): 0.0}
        assert pick(await samples(), "obsq_scheduler_missed_total") == {
            (("entry", "report:nightly"),): 0.0}

        async with obsq.Client(redis_url, namespace) as client:
            await client.schedule("blink", "@every 0.5s", "blink")

            async def blinked() -> bool:
                return value(await samples(), fires, entry="blink") >= 2
            await wait_until(blinked, what="blink counted")
            now = await samples()
            assert value(now, "obsq_tasks_enqueued_total", queue="default",
                         task="other") >= 2  # through the Client, with its metrics
            assert value(now, "obsq_scheduler_missed_total", entry="blink") == 0

            await client.unschedule("blink")

            async def dropped() -> bool:
                return not pick(await samples(), fires, entry="blink")
            await wait_until(dropped, what="the series of a removed entry dropped")
    finally:
        code = await asyncio.to_thread(scheduler.stop)
    assert code == 0, log.read_text()
