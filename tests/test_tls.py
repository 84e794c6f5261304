"""TLS to Redis: a redis-server of the test's own on a TLS port, with a CA, a server and a
client certificate the test makes (Redis asks every client for its certificate). Every
obsq process speaks rediss:// with the CA and the client's files from the URL's query or
from OBSQ_REDIS_TLS_*, and a wrong CA or a missing file stops it at start with one line."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    ObsqProcess,
    make_test_pki,
    newest_redis_server,
    obsq_env,
    one_clear_line,
    run_obsq,
    wait_for,
    wait_until,
)

import obsq
from obsq.engine.scheduler import Scheduler
from obsq.errors import ConfigurationError
from obsq.redis_server import RedisServer, free_port
from obsq.settings import SchedulerSettings

APP_MODULE = '''
import obsq

app = obsq.App(namespace="tls")


@app.task("echo", queue="tls")
async def echo(task):
    return task.payload


app.periodic("@every 0.5s", "echo", "tick", name="ticker", retention=60)
'''


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_redis(pki: dict[str, Path]) -> Iterator[RedisServer]:
    port = free_port()
    server = RedisServer(port, executable=newest_redis_server(), config={
        "port": 0, "tls-port": port, "tls-cert-file": pki["server.crt"],
        "tls-key-file": pki["server.key"], "tls-ca-cert-file": pki["ca.crt"],
        "tls-auth-clients": "yes"}).start()
    yield server
    server.close()


def tls_url(server: RedisServer, pki: dict[str, Path], ca: str = "ca.crt",
            client_cert: bool = True) -> str:
    query = f"ssl_ca_certs={pki[ca]}"
    if client_cert:
        query += f"&ssl_certfile={pki['client.crt']}&ssl_keyfile={pki['client.key']}"
    return f"rediss://127.0.0.1:{server.port}/0?{query}"


async def test_client_worker_and_scheduler_speak_tls(tls_redis, pki, app, namespace,
                                                     start_worker) -> None:
    url = tls_url(tls_redis, pki)

    @app.task("echo")
    async def echo(task: obsq.Task) -> object:
        return task.payload

    app.periodic("@every 0.2s", "echo", "tick", name="ticker", retention=60)
    await start_worker(redis_url=url)
    async with obsq.Client(url, app=app) as client:
        info = await client.enqueue("echo", {"over": "tls"}, retention=60)
        assert await client.result(info, timeout=10) == {"over": "tls"}
        scheduler = Scheduler(app, url, handle_signals=False,
                              settings=SchedulerSettings(lock_ttl=1.0))
        running = asyncio.ensure_future(scheduler.run())
        try:
            async def fired() -> bool:
                return any(s.name == "ticker" and s.fire_count for s in await client.schedules())
            await wait_until(fired, what="a fire over TLS")
        finally:
            scheduler.stop()
            await running


async def test_the_tls_files_from_the_environment(tls_redis, pki, monkeypatch) -> None:
    monkeypatch.setenv("OBSQ_REDIS_TLS_CA", str(pki["ca.crt"]))
    monkeypatch.setenv("OBSQ_REDIS_TLS_CERT", str(pki["client.crt"]))
    monkeypatch.setenv("OBSQ_REDIS_TLS_KEY", str(pki["client.key"]))
    async with obsq.Client(f"rediss://127.0.0.1:{tls_redis.port}/0", "envtls") as client:
        info = await client.enqueue("t", 1)
        assert (await client.info(info.id)).state == "pending"
    with pytest.raises(ConfigurationError, match="OBSQ_REDIS_TLS_CA, OBSQ_REDIS_TLS_CERT"):
        obsq.Client(f"redis://127.0.0.1:{tls_redis.port}/0")  # TLS files for plain TCP
    monkeypatch.setenv("OBSQ_REDIS_TLS_CA", "/nonexistent/ca.crt")
    with pytest.raises(ConfigurationError, match="/nonexistent/ca"):
        obsq.Client(f"rediss://127.0.0.1:{tls_redis.port}/0")


def test_every_command_speaks_tls(tls_redis, pki, tmp_path) -> None:
    """`obsq worker`, `obsq scheduler`, `obsq exporter` and `obsq ui` as subprocesses: the
    scheduler's fires run on the worker, the exporter and the console show the queue."""
    (tmp_path / "tlsapp.py").write_text(APP_MODULE)
    url = tls_url(tls_redis, pki)
    env = obsq_env(OBSQ_REDIS_URL=url, PYTHONUNBUFFERED="1")
    exporter_port, ui_port = free_port(), free_port()
    processes = [
        ObsqProcess(args, env, tmp_path, tmp_path / f"{args[0]}.log") for args in (
            ["worker", "tlsapp:app", "--http-port", "-1", "--no-metrics", "--no-tracing"],
            ["scheduler", "tlsapp:app", "--http-port", "-1"],
            ["exporter", "--namespace", "tls", "--http-port", str(exporter_port)],
            ["ui", "--namespace", "tls", "--http-port", str(ui_port)])]
    try:
        def completed_fires() -> int:
            result = run_obsq("stats", "--namespace", "tls", "--json", env=env)
            assert result.returncode == 0, result.stderr
            (queue,) = [q for q in json.loads(result.stdout)["queues"] if q["name"] == "tls"]
            return queue["depth"]["completed"]

        wait_for(lambda: completed_fires() >= 2, timeout=30, interval=0.3,
                 what="fires of the scheduler run by the worker, over TLS")
        metrics = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{exporter_port}/metrics", timeout=2).read().decode(),
            timeout=20, what="the exporter's metrics")
        assert 'obsq_queue_depth{queue="tls",state="completed"}' in metrics
        page = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{ui_port}/", timeout=2).read().decode(), timeout=20,
            what="the console's overview")
        assert "tls" in page
        for process in processes:
            assert process.poll() is None, process.log()
    finally:
        for process in processes:
            process.stop()
            process.close()


@pytest.mark.parametrize("args", [
    ["worker", "tests.engine.apps:app", "--http-port", "-1"],
    ["scheduler", "tests.engine.schedule_apps:app", "--http-port", "-1"],
    ["exporter", "--http-port", "0"],
    ["ui", "--http-port", "0"],
    ["stats"],
])
def test_a_wrong_ca_is_one_line_at_start(tls_redis, pki, args) -> None:
    result = run_obsq(*args, "--redis-url", tls_url(tls_redis, pki, ca="other-ca.crt"))
    one_clear_line(result, "cannot reach Redis", "certificate verify failed",
                   "not signed by the CA given")


def test_no_client_certificate_is_one_line_at_start(tls_redis, pki) -> None:
    result = run_obsq("worker", "tests.engine.apps:app", "--http-port", "-1", "--redis-url",
                      tls_url(tls_redis, pki, client_cert=False))
    one_clear_line(result, "cannot reach Redis", "give ssl_certfile and ssl_keyfile")


def test_tls_to_a_plain_server_names_the_likely_cause(redis_url, pki) -> None:
    """A plain Redis lets the TLS handshake time out: say so, not "give a certificate"."""
    url = redis_url.replace("redis://", "rediss://", 1).partition("?")[0]
    result = run_obsq("stats", "--redis-url", f"{url}?ssl_ca_certs={pki['ca.crt']}")
    line = one_clear_line(result, "cannot reach Redis", "does not answer the TLS handshake",
                          "plain Redis (redis://)")
    assert "ssl_certfile" not in line
