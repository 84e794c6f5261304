"""The image and the chart agree. `.ci/image.sh` builds the Dockerfile as
`obsq:<version of obsq/_version.py>`, and the chart's default image is `obsq` with the tag
`appVersion`: every version written down is obsq's, and the image's user is the chart's.
Building and smoke-testing the image itself is `.ci/image.sh`'s job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import yaml
from deploytools import CHART, ROOT, helm_template

import obsq

DOCKERFILE = ROOT / "Dockerfile"
SMOKE_DOCKERFILE = ROOT / "tests" / "image" / "Dockerfile"


def source_version() -> str:
    """Read as .ci/image.sh reads it: the `__version__ = "..."` line of obsq/_version.py."""
    match = re.search(r'^__version__ = "(.*)"$', (ROOT / "obsq" / "_version.py").read_text(),
                      re.M)
    assert match, "no version in obsq/_version.py"
    return match.group(1)


def arg_default(dockerfile: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.M)
    assert match, f"{dockerfile.relative_to(ROOT)} has no default for ARG {name}"
    return match.group(1)


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_every_version_is_obsqs_version() -> None:
    version = source_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    assert obsq.__version__ == version
    assert arg_default(DOCKERFILE, "VERSION") == version
    assert arg_default(SMOKE_DOCKERFILE, "IMAGE") == f"obsq:{version}"
    assert f"#   FROM obsq:{version}\n" in DOCKERFILE.read_text()


def test_chart_default_image_is_the_one_ci_builds() -> None:
    image = values()["image"]
    assert image["tag"] == "" and image["digest"] == ""  # so the tag is appVersion
    script = (ROOT / ".ci" / "image.sh").read_text()
    assert f'IMAGE="localhost/{image["repository"]}:$VERSION"' in script


def test_rendered_image_is_repository_and_app_version(helm: str) -> None:
    render = helm_template(helm)
    (worker,) = render.one("Deployment", "-worker")["spec"]["template"]["spec"]["containers"]
    assert worker["image"] == f"{values()['image']['repository']}:{source_version()}"


def test_image_user_is_the_charts_user() -> None:
    pod = values()["podSecurityContext"]
    assert f"\nUSER {pod['runAsUser']}:{pod['runAsGroup']}\n" in DOCKERFILE.read_text()
    assert values()["securityContext"]["runAsUser"] == pod["runAsUser"]


def test_dockerfile_keeps_the_python_slim_base_for_users() -> None:
    text = DOCKERFILE.read_text()
    # python:3.11-slim, or python:3.11-slim@sha256:... when PYTHON_DIGEST pins it
    assert arg_default(DOCKERFILE, "BASE_IMAGE") == (
        "python:${PYTHON_VERSION}-slim${PYTHON_DIGEST:+@}${PYTHON_DIGEST}")
    assert arg_default(DOCKERFILE, "PYTHON_DIGEST") == '""'
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}", "${BASE_IMAGE}"]


def test_oci_labels_come_from_build_arguments() -> None:
    text = DOCKERFILE.read_text()
    for label, arg in (("source", "SOURCE"), ("revision", "REVISION"), ("created", "CREATED"),
                       ("version", "VERSION")):
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in text
        assert re.search(rf"^ARG {arg}=", text, re.M)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert arg_default(DOCKERFILE, "SOURCE") in chart["sources"]
    script = (ROOT / ".ci" / "image.sh").read_text()
    for arg in ("REVISION", "CREATED"):
        assert f'--build-arg "{arg}=' in script


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_healthcheck_asks_healthz_with_python_alone() -> None:
    (line,) = [x for x in DOCKERFILE.read_text().splitlines() if x.startswith("HEALTHCHECK")]
    command = json.loads(line.split(" CMD ", 1)[1])  # exec form: no shell, no curl
    assert command[:2] == ["python", "-c"]
    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def check(port: int) -> int:
            env = {**os.environ, "OBSQ_HTTP_PORT": str(port)}
            return subprocess.run([sys.executable, "-c", command[2]], env=env,
                                  capture_output=True, timeout=30).returncode
        assert check(server.server_address[1]) == 0
        server.shutdown()
        assert check(server.server_address[1]) != 0  # nothing answers: unhealthy
    finally:
        server.server_close()
