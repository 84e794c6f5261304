"""`obsq ui`: the console served by uvicorn on 127.0.0.1:8181 unless told otherwise."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
from collections.abc import Iterator

import uvicorn

from obsq.background import on_stop_signals
from obsq.errors import ConfigurationError, StartupError
from obsq.inspection.inspector import Inspector
from obsq.ops.ui.app import create_app
from obsq.settings import env_flag

log = logging.getLogger("obsq")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8181


async def serve_from_args(inspector: Inspector, args: argparse.Namespace) -> None:
    """Serve until SIGTERM/SIGINT; flags win over their OBSQ_UI_* variables."""
    from obsq.observability import configure_logging

    configure_logging(os.environ.get("OBSQ_LOG_FORMAT", "text"),
                      os.environ.get("OBSQ_LOG_LEVEL", "INFO"))
    host = args.host or os.environ.get("OBSQ_UI_HOST") or DEFAULT_HOST
    port = args.http_port if args.http_port is not None else int(
        os.environ.get("OBSQ_UI_PORT") or DEFAULT_PORT)
    token = args.token or os.environ.get("OBSQ_UI_TOKEN") or None
    read_only = bool(args.read_only) or env_flag("OBSQ_UI_READ_ONLY")
    trace_url = args.trace_url or os.environ.get("OBSQ_UI_TRACE_URL") or None
    if trace_url and (not trace_url.startswith(("http://", "https://"))
                      or "{trace_id}" not in trace_url):
        raise ConfigurationError("--trace-url must be an http(s) URL containing {trace_id}, "
                                 f"got {trace_url!r}")
    sock = _bind(host, port)
    app = create_app(inspector, token=token, read_only=read_only, trace_url=trace_url)
    server = _Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                    server_header=False))
    mode = "read-only" if token is None or read_only else "actions with the token"
    log.info("console of namespace %s on http://%s:%d (%s)", inspector.namespace,
             *sock.getsockname()[:2], mode)
    remove_signals = on_stop_signals(lambda sig: setattr(server, "should_exit", True))
    try:
        await server.serve(sockets=[sock])
    finally:
        remove_signals()


class _Server(uvicorn.Server):
    """Stops on the stop signals as every obsq process does (obsq.background): uvicorn's own
    handling raises the signal again once it has shut down, which ended `obsq ui` with
    status -15 instead of 0 on a SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, so that a taken port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
