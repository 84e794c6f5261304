"""The image and the chart agree. `.ci/image.sh` builds the Dockerfile as
`obsq:<version of obsq/_version.py>`, and the chart's default image is `obsq` with the tag
`appVersion`: every version written down is obsq's, and the image's user is the chart's.
Building and smoke-testing the image itself is `.ci/image.sh`'s job."""

from __future__ import annotations

import re
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
    assert arg_default(DOCKERFILE, "BASE_IMAGE") == "python:${PYTHON_VERSION}-slim"
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
