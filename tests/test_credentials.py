"""Credentials beside the URL: a redis-server of the test's own with a password for the
default user and an ACL user with the rule of `obsq acl`. Every obsq process and both
clients take OBSQ_REDIS_PASSWORD (and OBSQ_REDIS_USERNAME) beside a URL without
credentials, as a Secret of a Redis chart holds them; a URL's own credentials win."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from support import (
    ObsqProcess,
    newest_redis_server,
    obsq_env,
    one_clear_line,
    run_obsq,
    wait_for,
)

import obsq
from obsq.broker.acl import acl_rule
from obsq.errors import ConfigurationError
from obsq.redis_server import RedisServer, free_port

ADMIN_PASSWORD = "adm1n-secret"
USER, USER_PASSWORD = "tenant", "t3nant-secret"
NAMESPACE = "creds"

APP_MODULE = f'''
import obsq

app = obsq.App(namespace="{NAMESPACE}")


@app.task("echo", queue="creds")
async def echo(task):
    return task.payload


app.periodic("@every 0.5s", "echo", "tick", name="ticker", retention=60)
'''


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """requirepass for the default user, and a user who may use the test's namespace."""
    server = RedisServer(executable=newest_redis_server(),
                         config={"requirepass": ADMIN_PASSWORD}).start()
    admin = redis.Redis(port=server.port, password=ADMIN_PASSWORD)
    admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{USER_PASSWORD}",
                          *acl_rule(NAMESPACE).split())
    admin.close()
    yield server
    server.close()


@pytest.fixture
def plain_url(locked_redis: RedisServer) -> str:
    return f"redis://127.0.0.1:{locked_redis.port}/0"


async def test_clients_take_the_password_and_user_from_the_environment(
        plain_url, monkeypatch) -> None:
    monkeypatch.setenv("OBSQ_REDIS_PASSWORD", ADMIN_PASSWORD)
    async with obsq.Client(plain_url, NAMESPACE) as client:
        info = await client.enqueue("echo", 1, queue="creds")
        assert (await client.info(info.id)).state == "pending"
    monkeypatch.setenv("OBSQ_REDIS_USERNAME", USER)
    monkeypatch.setenv("OBSQ_REDIS_PASSWORD", USER_PASSWORD)
    with obsq.SyncClient(plain_url, NAMESPACE) as client:
        info = client.enqueue("echo", 2, queue="creds")
        assert client.info(info.id).state == "pending"
    whoami = redis.Redis(port=int(plain_url.split(":")[2].split("/")[0]),
                         password=ADMIN_PASSWORD)
    clients = whoami.client_list()
    whoami.close()
    assert USER not in {c["user"] for c in clients}  # closed again; now the URL's own win
    monkeypatch.setenv("OBSQ_REDIS_PASSWORD", "wrong")
    url_with_user = plain_url.replace("://", f"://{USER}:{USER_PASSWORD}@", 1)
    async with obsq.Client(url_with_user, NAMESPACE) as client:
        assert (await client.info(info.id)).state == "pending"


def test_a_user_without_a_password_is_refused(plain_url, monkeypatch) -> None:
    monkeypatch.setenv("OBSQ_REDIS_USERNAME", USER)
    with pytest.raises(ConfigurationError, match="OBSQ_REDIS_USERNAME is set without"):
        obsq.Client(plain_url, NAMESPACE)


def test_every_command_takes_the_password_from_the_environment(plain_url, tmp_path) -> None:
    """`obsq worker`, `scheduler`, `exporter`, `ui` and `stats` as subprocesses, logged in as
    the ACL user: the scheduler's fires run on the worker, the exporter and the console show
    the queue."""
    (tmp_path / "credsapp.py").write_text(APP_MODULE)
    env = obsq_env(OBSQ_REDIS_URL=plain_url, OBSQ_REDIS_USERNAME=USER,
                   OBSQ_REDIS_PASSWORD=USER_PASSWORD, OBSQ_NAMESPACE=NAMESPACE,
                   PYTHONUNBUFFERED="1")
    exporter_port, ui_port = free_port(), free_port()
    processes = [
        ObsqProcess(args, env, tmp_path, tmp_path / f"{args[0]}.log") for args in (
            ["worker", "credsapp:app", "--queues", "creds=1", "--http-port", "-1",
             "--no-metrics", "--no-tracing"],
            ["scheduler", "credsapp:app", "--http-port", "-1"],
            ["exporter", "--http-port", str(exporter_port)],
            ["ui", "--http-port", str(ui_port)])]
    try:
        def completed_fires() -> int:
            result = run_obsq("stats", "--json", env=env)
            assert result.returncode == 0, result.stderr
            (queue,) = [q for q in json.loads(result.stdout)["queues"] if q["name"] == "creds"]
            return queue["depth"]["completed"]

        wait_for(lambda: completed_fires() >= 2, timeout=40, interval=0.3,
                 what="fires of the scheduler run by the worker, logged in from the env")
        metrics = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{exporter_port}/metrics", timeout=2).read().decode(),
            timeout=20, what="the exporter's metrics")
        assert 'obsq_queue_depth{queue="creds",state="completed"}' in metrics
        page = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{ui_port}/", timeout=2).read().decode(), timeout=20,
            what="the console's overview")
        assert "creds" in page
        for process in processes:
            assert process.poll() is None, process.log()
    finally:
        for process in processes:
            process.stop()
            process.close()


def test_no_password_at_all_names_the_variable(plain_url) -> None:
    result = run_obsq("stats", "--redis-url", plain_url)
    one_clear_line(result, "requires a password", "OBSQ_REDIS_PASSWORD")
    wrong = run_obsq("stats", "--redis-url", plain_url,
                     env=obsq_env(OBSQ_REDIS_PASSWORD="not-it"))
    line = one_clear_line(wrong, "refused the credentials")
    assert "not-it" not in line


async def test_a_sentinel_url_takes_the_master_password_from_the_environment(
        tmp_path, monkeypatch) -> None:
    """The Sentinels ask nothing here (their own password is the URL's sentinel_password);
    the master they name asks for OBSQ_REDIS_PASSWORD."""
    master = RedisServer(executable=newest_redis_server(),
                         config={"requirepass": ADMIN_PASSWORD}).start()
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\n"
                      f"sentinel monitor creds 127.0.0.1 {master.port} 1\n"
                      f"sentinel auth-pass creds {ADMIN_PASSWORD}\n")
    sentinel = subprocess.Popen([newest_redis_server(), str(config), "--sentinel"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: redis.Redis(port=port).sentinel_master("creds")["ip"],
                 what="the sentinel watching the master")
        monkeypatch.setenv("OBSQ_REDIS_PASSWORD", ADMIN_PASSWORD)
        async with obsq.Client(f"redis+sentinel://127.0.0.1:{port}/creds/0", NAMESPACE
                               ) as client:
            info = await client.enqueue("echo", 1, queue="creds")
            assert (await client.info(info.id)).state == "pending"
    finally:
        sentinel.kill()
        sentinel.wait()
        master.close()
