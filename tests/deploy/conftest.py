"""Fixtures of the deployment tests: the real helm (4 and 3), promtool and
kubernetes-validate, and the chart rendered once per session and scenario."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from deploytools import HELMS, SCENARIOS, Render, find_tool, helm_template, missing, run


@pytest.fixture(scope="session", params=sorted(HELMS))
def helm(request: pytest.FixtureRequest) -> str:
    """The real helm binary: helm4 (Helm 4.x) and helm3 (Helm 3.x)."""
    path = find_tool(HELMS[request.param])
    version = run([path, "version", "--short"]).stdout.strip()
    expected = "v4." if request.param == "helm4" else "v3."
    assert version.startswith(expected), f"{path} is {version}, expected {expected}x"
    return path


@pytest.fixture(scope="session")
def renders() -> dict[tuple[str, str], Render]:
    """Cache of `helm template` results by (helm path, scenario), filled on first use."""
    return {}


@pytest.fixture(scope="session", params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def rendered(helm: str, scenario: str, renders: dict[tuple[str, str], Render]) -> Render:
    """The chart rendered by `helm` for `scenario`, once per session."""
    key = (helm, scenario)
    if key not in renders:
        renders[key] = helm_template(helm, *SCENARIOS[scenario])
    return renders[key]


@pytest.fixture(scope="session")
def render_all(helm: str, renders: dict[tuple[str, str], Render]) -> Render:
    """The chart with every optional feature on (KEDA flavour)."""
    key = (helm, "all-keda")
    if key not in renders:
        renders[key] = helm_template(helm, *SCENARIOS["all-keda"])
    return renders[key]


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool")


@pytest.fixture(scope="session")
def kubernetes_validate() -> list[str]:
    if importlib.util.find_spec("kubernetes_validate") is None:
        missing("kubernetes-validate is not installed: pip install kubernetes-validate")
    return [sys.executable, "-m", "kubernetes_validate"]
