"""`opentelemetry-instrument python app.py` traces obsq's producers with no code change:
the real command, in a subprocess, exporting OTLP over HTTP into a receiver started here,
finds obsq's instrumentor through the `opentelemetry_instrumentor` entry point."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from support import PYPROJECT, obsq_env

from .helpers import missing_tool

APP = """
import asyncio, json, os
import obsq


async def main():
    client = obsq.Client(os.environ["OBSQ_REDIS_URL"], namespace=os.environ["OBSQ_NAMESPACE"])
    info = await client.enqueue("hello", {"n": 1})
    print(json.dumps({"id": info.id, "traceparent": info.headers.get("traceparent"),
                      "client": client.results.client_id}))
    await client.close()

asyncio.run(main())
"""
GROUP = "opentelemetry_instrumentor"


def declared_entry_point() -> str:
    """The instrumentor pyproject.toml registers (what an install of obsq puts in its
    metadata)."""
    return PYPROJECT["project"]["entry-points"][GROUP]["obsq"]


def metadata_dir(tmp_path: Path) -> Path | None:
    """Where this environment's installed obsq predates the entry point (an editable install
    made before it), a directory holding metadata that declares it, as installing would."""
    if any(e.name == "obsq" for e in entry_points(group=GROUP)):
        return None
    info = tmp_path / "site" / "obsq_instrumentor-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: obsq-instrumentor\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nobsq = {declared_entry_point()}\n")
    return info.parent


async def test_opentelemetry_instrument_traces_a_plain_producer(otlp_receiver, redis_url,
                                                                namespace, tmp_path):
    assert declared_entry_point() == "obsq.observability.instrumentor:ObsqInstrumentor"
    command = shutil.which("opentelemetry-instrument")
    if command is None:
        missing_tool("opentelemetry-instrument is not on PATH (pip install "
                     "opentelemetry-instrumentation opentelemetry-distro)")
    receiver = otlp_receiver("http/protobuf")
    (tmp_path / "app.py").write_text(APP)
    extra = metadata_dir(tmp_path)
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                   OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none",
                   OTEL_LOGS_EXPORTER="none", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                   OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                   OTEL_EXPORTER_OTLP_TIMEOUT="2", OTEL_SERVICE_NAME="shop")
    if extra is not None:
        env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(extra)])
    done = await asyncio.to_thread(
        subprocess.run, [command, sys.executable, "app.py"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sent = json.loads(done.stdout)

    (send,) = receiver.named("send default")  # the SDK flushed its spans at exit
    attributes = send["attributes"]
    assert send["service"] == "shop" and send["scope"] == "obsq"
    assert attributes["messaging.system"] == "obsq"
    assert attributes["messaging.operation.name"] == "send"
    assert attributes["messaging.message.id"] == sent["id"]
    assert attributes["messaging.client.id"] == sent["client"]
    assert attributes["server.address"] == "127.0.0.1"
    assert sent["traceparent"].startswith(f"00-{send['trace_id']}-{send['span_id']}-")
