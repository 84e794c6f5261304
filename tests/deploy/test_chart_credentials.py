"""Redis's password from a Secret as Redis charts keep it (`redis.auth.existingSecret`, key
`redis-password`), handed to every container as OBSQ_REDIS_PASSWORD; the production guard
saying in words what is wrong. Rendered by the real helm (4 and 3); the rendered worker
runs against a real redis-server that asks for the password."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
import redis
import yaml
from deploytools import helm_template
from rendered import container, resolved_env, start
from support import newest_redis_server, wait_for

import obsq
from obsq.redis_server import RedisServer, free_port

EVERY_CONTAINER = ["--set", "scheduler.enabled=true,exporter.enabled=true,ui.enabled=true"]


def test_the_password_secret_reaches_every_container(helm: str) -> None:
    render = helm_template(helm, "--set", "redis.auth.existingSecret=redis",
                           "--set", "redis.auth.username=jobs", *EVERY_CONTAINER)
    deployments = render.all("Deployment")
    assert len(deployments) == 4
    for deployment in deployments:
        env = {e["name"]: e for e in container(deployment)["env"]}
        assert env["OBSQ_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "redis", "key": "redis-password"}, deployment["metadata"]["name"]
        assert env["OBSQ_REDIS_USERNAME"]["value"] == "jobs"
        assert env["OBSQ_REDIS_URL"]["value"] == "redis://redis:6379/0"
    other_key = helm_template(helm, "--set", "redis.auth.existingSecret=redis",
                              "--set", "redis.auth.existingSecretPasswordKey=password")
    env = {e["name"]: e for e in container(other_key.one("Deployment", "-worker"))["env"]}
    assert env["OBSQ_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "password"
    assert "OBSQ_REDIS_USERNAME" not in env
    plain = container(helm_template(helm).one("Deployment", "-worker"))["env"]
    assert not [e for e in plain if e["name"].startswith("OBSQ_REDIS_PASSWORD")]


def test_production_takes_a_password_secret_beside_a_plain_url(helm: str) -> None:
    render = helm_template(helm, "--set", "production=true,redis.auth.existingSecret=redis",
                           "--set", "redis.url=rediss://redis-master:6380/0")
    names = [e["name"] for e in container(render.one("Deployment", "-worker"))["env"]]
    assert "OBSQ_REDIS_PASSWORD" in names


@pytest.mark.parametrize(("args", "said"), [
    (["--set", "production=true"],
     ["production: Redis's password must come from a Secret", "redis.auth.existingSecret",
      "redis-password", "redis.existingSecret"]),
    (["--set", "production=true,redis.auth.existingSecret=redis",
      "--set", "redis.url=redis://:s3cret@redis:6379/0"],
     ["production: redis.url holds a password in plain values", "redis.auth.existingSecret"]),
    (["--set", "redis.auth.username=jobs"],
     ["redis.auth.username is the user of the password in redis.auth.existingSecret"]),
], ids=["plain-url", "password-in-url", "user-without-secret"])
def test_refusals_say_what_is_wrong_in_words(helm: str, args: list[str], said: list[str]
                                             ) -> None:
    render = helm_template(helm, *args, check=False)
    assert render.returncode != 0
    for text in said:
        assert text in render.stderr, render.stderr
    assert "failed" not in render.stderr.replace("execution error", "")
    assert "s3cret" not in render.stderr


def test_the_rendered_worker_logs_in_with_the_secret_password(helm: str, tmp_path: Path
                                                              ) -> None:
    """The worker as rendered, its OBSQ_REDIS_PASSWORD from the Secret as the kubelet
    resolves it, runs a task on a Redis that asks for the password of an ACL user."""
    server = RedisServer(executable=newest_redis_server(),
                         config={"requirepass": "admin-pw"}).start()
    try:
        admin = redis.Redis(port=server.port, password="admin-pw")
        admin.execute_command("ACL", "SETUSER", "jobs", "on", ">jobs-pw", "~*", "&*", "+@all")
        admin.close()
        (tmp_path / "chartapp.py").write_text(
            "import obsq\n\napp = obsq.App(namespace='chartcreds')\n\n\n"
            "@app.task('echo')\nasync def echo(task):\n    return task.payload\n")
        port = free_port()
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({
            "app": "chartapp:app", "production": True,
            "obsq": {"namespace": "chartcreds", "logFormat": "text"},
            "redis": {"url": server.url, "auth": {"existingSecret": "redis",
                                                  "username": "jobs"}},
            "metrics": {"port": port}}))
        render = helm_template(helm, "-f", str(values))
        c = container(render.one("Deployment", "-worker"))
        env = resolved_env(c, {"redis": {"redis-password": "jobs-pw"}})
        worker = start(c, env, tmp_path, tmp_path / "worker.log")
        try:
            wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz",
                                                    timeout=2).status == 200,
                     timeout=30, what=f"the rendered worker ready\n{worker.log()}")
            with obsq.SyncClient(server.url.replace("://", "://jobs:jobs-pw@", 1),
                                 "chartcreds") as client:
                info = client.enqueue("echo", {"with": "the Secret's password"}, retention=60)
                assert client.result(info, timeout=20) == {"with": "the Secret's password"}
        finally:
            assert worker.stop() == 0, worker.log()
            worker.close()
    finally:
        server.close()
