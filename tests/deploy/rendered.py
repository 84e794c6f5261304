"""Running what the chart renders: a container's environment resolved as the kubelet does
(fieldRef, secretKeyRef from the test's Secrets, $(VAR) references), and its command
started as a local `obsq` process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from support import ObsqProcess, obsq_env

FIELDS = {"metadata.name": "jobs-obsq-pod-0", "metadata.namespace": "jobs"}
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The obsq container of a pod template: the one kubectl picks by default (a worker
    pod may have sidecars beside it)."""
    pod = deployment["spec"]["template"]
    name = pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"]
    (obsq,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return obsq


def resolved_env(c: dict[str, Any], secrets: dict[str, dict[str, str]] | None = None
                 ) -> dict[str, str]:
    """The container's variables as the kubelet hands them to the process."""
    env: dict[str, str] = {}
    for entry in c.get("env", []):
        source = entry.get("valueFrom")
        if source is None:
            value = REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)),
                                  entry.get("value", ""))
        elif "fieldRef" in source:
            value = FIELDS[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = (secrets or {})[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"unexpected valueFrom {source}")
        env[entry["name"]] = value
    return env


def start(c: dict[str, Any], env: dict[str, str], cwd: Path, log: Path) -> ObsqProcess:
    """The container's `obsq ARGS` with its environment (and this checkout's obsq)."""
    assert c["command"] == ["obsq"], c["command"]
    return ObsqProcess(c["args"], obsq_env(**env), cwd, log)
