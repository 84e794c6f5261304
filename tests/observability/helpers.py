"""Helpers of the observability tests: scraping and parsing /metrics, probing the HTTP
endpoint, a real Prometheus server and OTLP receivers (HTTP/protobuf and gRPC).

The Prometheus and receiver classes carry no pytest dependency, so other test folders can
use them directly; tests/observability/conftest.py wraps them as fixtures."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from support import ROOT, missing_tool, stop_process, wait_until  # noqa: F401 - re-exported

from obsq.redis_server import free_port

OPENMETRICS = "application/openmetrics-text; version=1.0.0"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- HTTP -----------------------------------------------------------------------------------

def http_get(port: int, path: str, *, accept: str | None = None, timeout: float = 10
             ) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of GET http://127.0.0.1:port/path; never raises on 4xx/5xx."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body, _ = http_get(port, path)
    return status, json.loads(body)


async def wait_ready(port: int, timeout: float = 20) -> dict[str, Any]:
    """The body of /readyz once a starting process answers it with 200 (while it starts
    it may not listen yet, or answer 503 "starting")."""
    async def ready() -> dict[str, Any] | None:
        try:
            status, body = await asyncio.to_thread(probe, port, "/readyz")
        except OSError:  # not listening yet
            return None
        return body if status == 200 else None
    return await wait_until(ready, timeout=timeout, what=f"readyz on port {port}")


def scrape(port: int, *, openmetrics: bool = False) -> str:
    status, body, _ = http_get(port, "/metrics", accept=OPENMETRICS if openmetrics else None)
    assert status == 200, body
    return body.decode()


def parse(text: str) -> Samples:
    """Every sample of a text exposition: {(name, sorted label pairs): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pick(samples: Samples, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {key: v for (n, key), v in samples.items() if n == name and want <= set(key)}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` with exactly these labels; 0 when absent."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# -- a real Prometheus ------------------------------------------------------------------------

class PrometheusServer:
    """The `prometheus` binary on a free loopback port, scraping `targets` every second,
    with its TSDB in `directory`, evaluating `rule_files` as often. `static_configs`:
    more groups of targets with their labels, as the job's service discovery would give
    them ({"targets": [...], "labels": {...}}). `api()`, `reply()`, `query()` and
    `wait_for()` use its HTTP API."""

    def __init__(self, binary: str, directory: Path, targets: Iterable[str], *,
                 scrape_interval: str = "1s", rule_files: Iterable[str | Path] = (),
                 job: str = "obsq", labels: dict[str, str] | None = None,
                 static_configs: Iterable[dict[str, Any]] = (),
                 metric_relabel_configs: Iterable[dict[str, Any]] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "rule_files": [str(r) for r in rule_files],
            "scrape_configs": [{
                "job_name": job, "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [{"targets": list(targets), "labels": labels or {}},
                                   *static_configs],
                "metric_relabel_configs": list(metric_relabel_configs),
            }],
        }
        self.config = self.directory / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log = self.directory / "prometheus.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--enable-feature=exemplar-storage"],
                stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready in {timeout} s: {self.log.read_text()[-2000:]}")

    def api(self, path: str, **params: Any) -> Any:
        """The `data` of a successful reply; an AssertionError carrying Prometheus's error
        (bad_data, execution, ...) otherwise."""
        return self.reply(path, **params)["data"]

    def reply(self, path: str, **params: Any) -> dict[str, Any]:
        """The whole JSON reply (status, data, warnings), asserted successful."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422/503 carry a JSON error body
            body = exc.read()
            try:
                reply = json.loads(body)
            except ValueError:
                reply = {"status": "error", "error": f"HTTP {exc.code}: {body[:500]!r}"}
        assert reply.get("status") == "success", f"{path} {params}: {reply}"
        return reply

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        return self.api("query", query=expr)["result"]

    def values(self, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
        """{(label values...): value} of an instant query."""
        return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1])
                for r in self.query(expr)}

    async def wait_for(self, expr: str, check: Callable[[list[dict[str, Any]]], bool] = bool,
                       timeout: float = 20.0) -> list[dict[str, Any]]:
        """Poll `expr` until `check(result)` holds (by default: any series)."""
        result: list[dict[str, Any]] = []

        def ready() -> bool:
            nonlocal result
            result = self.query(expr)
            return check(result)

        await wait_until(lambda: asyncio.to_thread(ready), timeout=timeout, interval=0.5,
                         what=f"Prometheus query {expr}")
        return result

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def close(self) -> None:
        stop_process(self.process, timeout=10)


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


# -- OTLP receivers --------------------------------------------------------------------------

class SpanStore:
    """Spans received over OTLP, flattened to dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self._lock = threading.Lock()

    def add(self, request: Any) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _any_value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append({
                        "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex(), "kind": s.kind,
                        "attributes": {a.key: _any_value(a.value) for a in s.attributes},
                        "events": [{"name": e.name, "attributes": {
                            a.key: _any_value(a.value) for a in e.attributes}}
                            for e in s.events],
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        "status": s.status.code, "status_message": s.status.message,
                        "service": resource.get("service.name"), "scope": scope_spans.scope.name,
                    })
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class HttpReceiver(SpanStore):
    """POST /v1/traces with an ExportTraceServiceRequest and /v1/metrics with an
    ExportMetricsServiceRequest (protobuf, maybe gzip); the metrics' data points are kept in
    `points`, flattened to dicts."""

    protocol = "http/protobuf"

    def __init__(self) -> None:
        super().__init__()
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.points: list[dict[str, Any]] = []
        paths = {"/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse,
                                self.add),
                 "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse,
                                 self.add_metrics)}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path not in paths:
                    self.send_response(404)
                    self.end_headers()
                    return
                request, response, add = paths[self.path]
                add(request.FromString(body))
                reply = response().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add_metrics(self, request: Any) -> None:
        points = []
        for resource_metrics in request.resource_metrics:
            resource = {a.key: _any_value(a.value) for a in resource_metrics.resource.attributes}
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for p in getattr(metric, kind).data_points:
                        point = {"name": metric.name, "unit": metric.unit, "kind": kind,
                                 "service": resource.get("service.name"),
                                 "schema_url": scope_metrics.schema_url,
                                 "attributes": {a.key: _any_value(a.value)
                                                for a in p.attributes}}
                        if kind == "histogram":
                            point.update(count=p.count, sum=p.sum)
                        else:
                            point["value"] = p.as_double if p.HasField("as_double") \
                                else p.as_int
                        points.append(point)
        with self._lock:
            self.points.extend(points)

    def metric(self, name: str, **attributes: Any) -> list[dict[str, Any]]:
        """The points of `name` received so far whose attributes include `attributes`."""
        with self._lock:
            return [p for p in self.points if p["name"] == name
                    and all(p["attributes"].get(k) == v for k, v in attributes.items())]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcReceiver(SpanStore):
    """A grpcio TraceService on a free port."""

    protocol = "grpc"

    def __init__(self) -> None:
        super().__init__()
        import grpc
        from opentelemetry.proto.collector.trace.v1 import (
            trace_service_pb2,
            trace_service_pb2_grpc,
        )

        store = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                store.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(grace=None)


def otel_env(receiver: HttpReceiver | GrpcReceiver, service: str) -> dict[str, str]:
    """OTEL_* variables that make setup_tracing export to `receiver` quickly."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": service}
