"""Fixtures of the observability tests: a real Prometheus (`prometheus`, a factory taking
scrape targets), OTLP receivers over HTTP/protobuf and gRPC (`otlp_receiver`), and the
spans this process ends (`spans`: an in-memory exporter on a session-wide SDK tracer
provider).

Another test folder reuses the Prometheus fixture with, in its conftest.py,
`from observability.conftest import prometheus  # noqa: F401` (tests/ is on sys.path), or
the class itself: `from observability.helpers import PrometheusServer`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .helpers import (
    GrpcReceiver,
    HttpReceiver,
    PrometheusServer,
    missing_tool,
    prometheus_binary,
)

_exporter = InMemorySpanExporter()


def _install_provider() -> None:
    """One SDK provider for the whole test process (a global provider can be set once)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    elif getattr(provider, "_obsq_test", None) is None:
        provider.add_span_processor(SimpleSpanProcessor(_exporter))  # type: ignore[attr-defined]
    provider._obsq_test = True  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended during this test, in memory."""
    _install_provider()
    _exporter.clear()
    yield _exporter
    _exporter.clear()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """`prom = prometheus(["127.0.0.1:9191"], rule_files=[...])`: a real Prometheus
    scraping the targets every second (TSDB under tmp_path), stopped after the test.
    Missing binary: fails under CI, skips elsewhere."""
    started: list[PrometheusServer] = []

    def start(targets: list[str], **options: Any) -> PrometheusServer:
        binary = prometheus_binary()
        if binary is None:
            missing_tool("prometheus is not on PATH (apt-get install prometheus)")
        server = PrometheusServer(binary, tmp_path / f"prometheus-{len(started)}", targets,
                                  **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def otlp_receiver() -> Iterator[Callable[[str], HttpReceiver | GrpcReceiver]]:
    """`receiver = otlp_receiver("grpc" | "http/protobuf")`, closed after the test."""
    started: list[Any] = []

    def start(protocol: str) -> HttpReceiver | GrpcReceiver:
        receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()
