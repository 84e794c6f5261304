"""Helpers of the deployment tests: finding the real tools, running `helm template`,
and the scenarios that every chart test renders.

Tools come from .cache/bin (where .ci/install-tools.sh puts Helm), then PATH. A
missing tool skips the test on a developer's machine and fails it under CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT

CHART = ROOT / "deploy" / "helm" / "obsq"
HERE = Path(__file__).resolve().parent
CRD_APIS = ["monitoring.coreos.com/v1", "keda.sh/v1alpha1"]
HELMS = {"helm4": "helm", "helm3": "helm3"}  # test id -> binary name in .cache/bin


def missing(message: str) -> None:
    """Fail under CI, which installs every tool; skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def find_tool(name: str) -> str:
    """Path of a command-line tool: .cache/bin/NAME first, then PATH."""
    cached = ROOT / ".cache" / "bin" / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    found = shutil.which(name)
    if found:
        return found
    missing(f"{name} not found in .cache/bin or on PATH: run `bash .ci/install-tools.sh`")
    raise AssertionError("unreachable")


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


@dataclass
class Render:
    """The result of one `helm template`."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    docs: list[dict[str, Any]] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [
            d
            for d in self.docs
            if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)
        ]
        assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {self.kinds()}"
        return found[0]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]


def helm_template(helm: str, *args: str, check: bool = True) -> Render:
    cmd = [helm, "template", "jobs", str(CHART), "--namespace", "jobs", *args]
    proc = run(cmd)
    render = Render(cmd, proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode == 0:
        render.docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    elif check:
        pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stderr}", pytrace=False)
    return render


# Value files of the scenarios every chart test runs with, and the extra flags.
SCENARIOS: dict[str, list[str]] = {
    "default": [],
    "all-keda": ["-f", str(HERE / "values-all.yaml"), *[f"--api-versions={a}" for a in CRD_APIS]],
    "all-hpa": [
        "-f",
        str(HERE / "values-all.yaml"),
        "--set",
        "keda.enabled=false,autoscaling.enabled=true",
        *[f"--api-versions={a}" for a in CRD_APIS],
    ],
    "minimal-example": ["-f", str(ROOT / "examples" / "helm" / "values-minimal.yaml")],
    "production-example": [
        "-f",
        str(ROOT / "examples" / "helm" / "values-production.yaml"),
        *[f"--api-versions={a}" for a in CRD_APIS],
    ],
}
