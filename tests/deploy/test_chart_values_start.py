"""What the chart's schema accepts, obsq runs: every value of every enum of
values.schema.json, the lowest value each numeric setting allows, and names at the edge of
their patterns, rendered by the real helm and started as the rendered worker, scheduler,
exporter and console against a real Redis. Each must answer /healthz (and not exit)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploytools import CHART, helm_template
from rendered import container, resolved_env, start
from support import sync_redis, wait_for

from obsq.redis_server import free_port

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# the lowest value each of these takes, as the schema allows it
MINIMA = {"worker": {"concurrency": 1, "shutdownTimeout": 1, "leaseSeconds": 3,
                     "maxRecoveries": 0, "stuckLimit": 1}}
EDGES: list[dict[str, Any]] = [
    {"tracing": {"samplerArg": "0"}, "worker": {"queues": [{"name": "crit:high.v2-x_1",
                                                           "weight": 1}]}},
    {"tracing": {"samplerArg": "1"}, "obsq": {"namespace": "{ns}.v2-edge_1"}},
    {"tracing": {"samplerArg": ".5"}},
    {"tracing": {"samplerArg": "1.0"}},
    {"tracing": {"samplerArg": "0.25"}},
    {"tracing": {"samplerArg": ""}},
]


def enums(node: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[Any]]:
    """Every enum of a value (not of a list's items), by its path in values.yaml."""
    found: dict[tuple[str, ...], list[Any]] = {}
    if isinstance(node, dict):
        if "enum" in node and path:
            found[path] = node["enum"]
        for name, child in node.get("properties", {}).items():
            found.update(enums(child, (*path, name)))
    return found


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def variants() -> list[dict[str, Any]]:
    """As many value sets as the longest enum has values: set i takes value i of each."""
    every = enums(SCHEMA)
    assert ("tracing", "protocol") in every and ("obsq", "logLevel") in every
    count = max(len(values) for values in every.values())
    out = []
    for i in range(count):
        values: dict[str, Any] = {}
        for path, choices in every.items():
            leaf: dict[str, Any] = {path[-1]: choices[i % len(choices)]}
            for part in reversed(path[:-1]):
                leaf = {part: leaf}
            values = merged(values, leaf)
        values = merged(values, EDGES[i % len(EDGES)])
        out.append(merged(values, MINIMA) if i == 0 else values)
    return out


VARIANTS = variants()


# one test a value set, so that parallel runs spread them
@pytest.mark.parametrize("number", range(len(VARIANTS)))
def test_every_value_the_schema_allows_starts(helm: str, redis_url: str, admin_redis_url: str,
                                             namespace: str, tmp_path: Path, number: int
                                             ) -> None:
    try:
        start_rendered(helm, redis_url, namespace, number, VARIANTS[number], tmp_path)
    finally:  # the test's namespaces only: the chart's default one is another test's
        r = sync_redis(admin_redis_url)
        for key in list(r.scan_iter(match=f"{namespace}*", count=1000)):
            r.delete(key)


def start_rendered(helm: str, redis_url: str, namespace: str, number: int,
                   values: dict[str, Any], tmp_path: Path) -> None:
    """Render `values`, start each Deployment's process and see it answer /healthz."""
    edge = values.get("obsq", {}).get("namespace", "{ns}")
    values = merged(values, {"obsq": {"namespace": edge.replace("{ns}", namespace)}})
    port, ui_port = free_port(), free_port()
    values = merged(values, {
        "app": "tests.engine.apps:app", "redis": {"url": redis_url},
        "scheduler": {"enabled": True}, "exporter": {"enabled": True},
        "ui": {"enabled": True, "port": ui_port},
        "tracing": {"enabled": True, "endpoint": f"http://127.0.0.1:{free_port()}"},
        "metrics": {"port": port},
        # spans to nowhere: give up at once when the processes flush them on stop
        "extraEnv": [{"name": "OTEL_EXPORTER_OTLP_TIMEOUT", "value": "1"}]})
    file = tmp_path / f"values-{number}.yaml"
    file.write_text(yaml.safe_dump(values))
    render = helm_template(helm, "-f", str(file))
    for deployment in render.all("Deployment"):
        c = container(deployment)
        env = resolved_env(c)
        kind = c["args"][0]
        if kind != "ui":  # the processes share a host here, not a pod each
            env["OBSQ_HTTP_PORT"] = str(free_port())
        answer = env.get("OBSQ_UI_PORT") if kind == "ui" else env["OBSQ_HTTP_PORT"]
        log = tmp_path / f"{number}-{kind}.log"
        process = start(c, env, Path(__file__).resolve().parents[2], log)
        try:
            def up_or_gone(answer: str | None = answer, process: Any = process) -> bool:
                if process.poll() is not None:
                    return True
                with urllib.request.urlopen(f"http://127.0.0.1:{answer}/healthz",
                                            timeout=2) as response:
                    return response.status == 200
            wait_for(up_or_gone, timeout=40, interval=0.2, what=f"obsq {kind} up")
            assert process.poll() is None, (
                f"`obsq {kind}` with {file.read_text()}\nexited:\n{process.log()}")
        finally:
            code = process.stop()
            process.close()
        assert code == 0, process.log()


def test_values_obsq_would_refuse_are_refused_by_the_schema(helm: str) -> None:
    for setting, path in (("tracing.protocol=http/json", "/tracing/protocol"),
                          ("tracing.samplerArg=2", "/tracing/samplerArg"),
                          ("obsq.namespace=a b", "/obsq/namespace"),
                          ("obsq.namespace=a{b}", "/obsq/namespace"),
                          ("redis.url=http://redis:6379/0", "/redis/url"),
                          ("obsq.namespace=shop:tenant2", "/obsq/namespace"),
                          ("obsq.namespace=shop*", "/obsq/namespace")):
        render = helm_template(helm, "--set-string", setting, check=False)
        assert render.returncode != 0, f"{setting} was accepted"
        # Helm 4 names the value '/tracing/protocol', Helm 3 'tracing.protocol'
        assert path in render.stderr or path[1:].replace("/", ".") in render.stderr, \
            render.stderr


def test_the_schema_takes_every_redis_url_scheme_obsq_takes() -> None:
    from obsq.broker.connection import SCHEMES

    pattern = re.compile(SCHEMA["properties"]["redis"]["properties"]["url"]["pattern"])
    assert [s for s in SCHEMES if not pattern.match(f"{s}://redis:6379/0")] == []
    assert not pattern.match("http://redis:6379/0")
