"""The HTTP endpoint Kubernetes and Prometheus talk to, on the standard library's threaded
HTTP server, so that it answers even while the event loop is busy (and can tell it is):

- `/metrics`: prometheus-client's exposition, OpenMetrics when the Accept header asks
  for it (histograms then carry trace-id exemplars), gzip when accepted;
- `/healthz` (liveness) and `/readyz` (readiness): 200, or 503 with the reason the
  process's checks give (obsq/observability/probes.py);
- `/`: a short JSON status.
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from obsq._version import __version__
from obsq.errors import StartupError
from obsq.observability.probes import Check

log = logging.getLogger("obsq")


class HealthServer:
    """/metrics, /healthz, /readyz and / on a port of their own, served from threads."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, *, live: Check,
                 ready: Check, status: Callable[[], dict[str, Any]]) -> None:
        handler = type("Handler", (_Handler,), {"registry": registry, "live": staticmethod(live),
                                                "ready": staticmethod(ready),
                                                "status": staticmethod(status)})
        try:
            self._server = _Server((host, port), handler)
        except OSError as exc:  # the port is taken, or the host is not this machine's
            raise StartupError(f"cannot serve HTTP on {host}:{port}: {exc.strerror or exc}"
                                     " (choose another port with --http-port or "
                                     "OBSQ_HTTP_PORT)") from None
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name=f"obsq-http-{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that went away mid-request (a probe's timeout, a scrape cut short) is
        no error of the server's: no traceback for it, only for real failures."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    live: Check
    ready: Check
    status: Callable[[], dict[str, Any]]
    server_version = f"obsq/{__version__}"
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed after this

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/metrics":
                self._metrics(parse_qs(url.query))
            elif url.path in ("/healthz", "/livez"):
                self._probe(self.live())
            elif url.path == "/readyz":
                self._probe(self.ready())
            elif url.path == "/":
                self._json(200, self.status())
            else:
                self._json(404, {"error": "not found", "paths": ["/metrics", "/healthz",
                                                                 "/readyz", "/"]})
        except ConnectionError:  # the caller left (a probe that timed out): nobody to tell
            log.debug("HTTP %s: the client closed the connection first", url.path)
        except Exception as exc:
            log.exception("HTTP %s failed", url.path)
            self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _metrics(self, params: dict[str, list[str]]) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        registry: Any = self.registry
        if "name[]" in params:
            registry = registry.restricted_registry(params["name[]"])
        body = encoder(registry)
        headers = {"Content-Type": content_type}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, headers)

    def _probe(self, problem: str | None) -> None:
        if problem is None:
            self._json(200, {"status": "ok"})
        else:
            self._json(503, {"status": "unavailable", "reason": problem})

    def _json(self, code: int, value: dict[str, Any]) -> None:
        self._send(code, json.dumps(value).encode() + b"\n",
                   {"Content-Type": "application/json"})

    def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would drown the worker's own logs
