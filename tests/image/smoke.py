"""Smoke test of the obsq image.

`.ci/image.sh` runs this file in a build stage `FROM` the freshly built image
(tests/image/Dockerfile), as the image's own user and on the host's network: `podman
run` is refused on the CI machines, a build step is not. Every entry of CHECKS runs in
turn and the first that fails fails the build. Each command that the Helm chart runs
from the image has its entry; a command that answers HTTP needs one line,
`serves([argv...], "/path", ...)`, with `{port}` in argv for the port it must listen on.

Environment: SMOKE_REDIS_URL, a Redis this script may write to (it works in a namespace
of its own and deletes it at the end), SMOKE_VERSION, the version the image must be, and
SMOKE_HEALTHCHECK, the image's HEALTHCHECK test as JSON (["CMD", ...]).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata

REDIS_URL = os.environ["SMOKE_REDIS_URL"]
VERSION = os.environ["SMOKE_VERSION"]
HEALTHCHECK = json.loads(os.environ["SMOKE_HEALTHCHECK"])
NAMESPACE = f"obsq-smoke-{uuid.uuid4().hex[:12]}"
APP = "smoke_tasks:app"
UID = 10001
TIMEOUT = 30.0
# obsq's extra for a project's own tests (obsq's own needs are dependency groups, which the
# package does not carry): its distributions stay out of the image unless something the
# image runs needs them too.
NOT_SHIPPED_EXTRAS = frozenset({"testing"})
# What the base image brings to install packages with.
BASE_DISTRIBUTIONS = frozenset({"pip", "setuptools", "wheel"})
# Loaded by obsq only when tracing is configured, for OTEL_EXPORTER_OTLP_PROTOCOL grpc
# and http/protobuf (the otlp extra, which the image installs).
TRACE_EXPORTERS = ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter")


class Failure(Exception):
    pass


def expect(condition: object, message: str) -> None:
    if not condition:
        raise Failure(message)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- distributions -----------------------------------------------------------------------

def requirements(name: str, skip_extras: frozenset[str] = frozenset()) -> list[str]:
    """Names of the distributions `name` requires, under any marker, but not those of
    `skip_extras`."""
    names = []
    for requirement in metadata.requires(name) or ():
        extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", requirement)
        if extra and extra.group(1) in skip_extras:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        expect(match, f"cannot read the requirement {requirement!r} of {name}")
        names.append(normalize(match.group()))
    return names


def shipped() -> set[str]:
    """obsq and every installed distribution it needs, recursively: its dependencies and
    the extras of obsq and of them that are installed, except NOT_SHIPPED_EXTRAS."""
    installed = {normalize(d.metadata["Name"]) for d in metadata.distributions()}
    found: set[str] = set()
    todo = ["obsq"]
    while todo:
        name = todo.pop()
        if name in found or name not in installed:
            continue
        found.add(name)
        todo += requirements(name, NOT_SHIPPED_EXTRAS if name == "obsq" else frozenset())
    return found


def package_roots(name: str) -> set[str]:
    """The outermost regular packages and top-level modules of a distribution
    (`opentelemetry.sdk`, not the `opentelemetry` namespace it shares)."""
    modules = set()
    for file in metadata.distribution(name).files or ():
        parts = file.parts
        if parts[0] == ".." or parts[0].endswith((".dist-info", ".data")) or (
                "__pycache__" in parts):
            continue
        if parts[-1] == "__init__.py":
            modules.add(".".join(parts[:-1]))
        elif len(parts) == 1 and file.suffix in (".py", ".so"):
            modules.add(parts[0].split(".")[0])
    return {m for m in modules if not any(m.startswith(f"{o}.") for o in modules)}


# --- processes and HTTP ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@contextlib.contextmanager
def running(argv: list[str], ready: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start `argv` ({port} replaced by a free port), wait until `ready` answers 200,
    yield the base URL; then SIGTERM, and the process must exit 0."""
    port = free_port()
    argv = [arg.format(port=port) for arg in argv]
    base = f"http://127.0.0.1:{port}"
    command = " ".join(argv[:2])
    proc = subprocess.Popen(argv, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            expect(proc.poll() is None, f"{command} exited with {proc.returncode} at start")
            with contextlib.suppress(OSError):
                if get(base + ready)[0] == 200:
                    break
            expect(time.monotonic() < deadline, f"{command}: {ready} not 200 in {TIMEOUT} s")
            time.sleep(0.1)
        yield base
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise Failure(f"{command} did not stop within {TIMEOUT} s of SIGTERM") from None
    expect(code == 0, f"{command} exited with {code} after SIGTERM")


def serves(argv: list[str], *paths: str) -> None:
    """`argv` starts, answers 200 on every path, and stops cleanly on SIGTERM."""
    with running(argv, ready=paths[0]) as base:
        for path in paths:
            status, _ = get(base + path)
            expect(status == 200, f"{' '.join(argv[:2])}: {path} answered {status}")


# --- checks ------------------------------------------------------------------------------

def check_user() -> None:
    expect(os.getuid() == UID and os.getgid() == UID,
           f"running as {os.getuid()}:{os.getgid()}, expected {UID}:{UID}")
    expect(os.getcwd() == "/app", f"working directory {os.getcwd()}, expected /app")


def check_version() -> None:
    out = subprocess.run(["obsq", "--version"], capture_output=True, text=True, check=True)
    expect(out.stdout.strip() == f"obsq {VERSION}",
           f"obsq --version said {out.stdout.strip()!r}, expected 'obsq {VERSION}'")


def check_imports() -> None:
    modules = sorted({m for name in shipped() for m in package_roots(name)})
    for module in [*modules, *TRACE_EXPORTERS]:
        importlib.import_module(module)
    subprocess.run(["python", "-m", "pip", "check"], check=True, stdout=subprocess.DEVNULL)
    print(f"smoke: imported {len(modules) + len(TRACE_EXPORTERS)} modules of "
          f"{len(shipped())} distributions", flush=True)


def check_nothing_for_tests() -> None:
    installed = {normalize(d.metadata["Name"]) for d in metadata.distributions()}
    extra = installed - shipped() - BASE_DISTRIBUTIONS
    expect(not extra, f"distributions obsq does not need: {sorted(extra)}")


def check_worker() -> None:
    """A worker runs tasks enqueued here, answers /healthz and /metrics, and exports its
    spans over OTLP gRPC, as the chart's tracing.enabled sets it up."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    import obsq

    spans: list[str] = []

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            spans.extend(span.name for resource in request.resource_spans
                         for scope in resource.scope_spans for span in scope.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    receiver = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), receiver)
    otlp_port = receiver.add_insecure_port("127.0.0.1:0")
    receiver.start()
    tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "obsq-smoke"}
    jobs = [obsq.Job("smoke:add", [n, 1], retention=60) for n in range(5)]
    jobs.append(obsq.Job("smoke:upper", "obsq", retention=60))
    # --loop uvloop: a worker refuses to start without it, so the image must carry the extra
    worker = ["obsq", "worker", APP, "--http-port", "{port}", "--loop", "uvloop"]
    try:
        with running(worker, ready="/readyz", env=tracing) as base, \
                obsq.SyncClient(REDIS_URL, namespace=NAMESPACE) as client:
            results = [client.result(info, timeout=TIMEOUT) for info in client.enqueue_many(jobs)]
            expect(results == [1, 2, 3, 4, 5, "OBSQ"], f"results {results}")
            status, _ = get(base + "/healthz")
            expect(status == 200, f"/healthz answered {status}")
            status, text = get(base + "/metrics")
            expect(status == 200, f"/metrics answered {status}")
            done = sum(float(value) for labels, value in re.findall(
                r"^obsq_tasks_processed_total\{(.*)\} (\S+)$", text, re.MULTILINE)
                if 'outcome="success"' in labels)
            expect(done == len(jobs), f"/metrics counts {done} successes, expected {len(jobs)}")
            expect(f'obsq_build_info{{version="{VERSION}"}} 1.0' in text,
                   "/metrics has no obsq_build_info of this version")
    finally:
        receiver.stop(None)
    processed = spans.count("process default")
    expect(processed == len(jobs), f"{processed} 'process default' spans exported over "
           f"OTLP, expected {len(jobs)} (got {sorted(set(spans))})")


def check_healthcheck() -> None:
    """The image's HEALTHCHECK passes while a worker answers, and fails once it stopped."""
    expect(HEALTHCHECK[0] == "CMD", f"HEALTHCHECK {HEALTHCHECK[:2]}: not the exec form")

    def health(port: str) -> int:
        env = {**os.environ, "OBSQ_HTTP_PORT": port}
        return subprocess.run(HEALTHCHECK[1:], env=env, capture_output=True,
                              timeout=TIMEOUT).returncode

    with running(["obsq", "worker", APP, "--http-port", "{port}"], ready="/readyz") as base:
        port = base.rsplit(":", 1)[1]
        expect(health(port) == 0, "the HEALTHCHECK failed while the worker answered")
    expect(health(port) != 0, "the HEALTHCHECK passed with no worker running")


CHECKS: list[tuple[str, Callable[[], None]]] = [
    ("runs as UID 10001 in /app", check_user),
    ("obsq --version", check_version),
    ("every shipped distribution imports", check_imports),
    ("nothing for tests in the image", check_nothing_for_tests),
    ("obsq worker runs tasks, answers /healthz and /metrics, exports spans", check_worker),
    ("the image's HEALTHCHECK asks a worker's /healthz", check_healthcheck),
    ("obsq scheduler answers /healthz and /readyz",
     lambda: serves(["obsq", "scheduler", APP, "--http-port", "{port}"], "/readyz", "/healthz")),
    ("obsq exporter answers /healthz and /metrics",
     lambda: serves(["obsq", "exporter", "--http-port", "{port}"], "/healthz", "/metrics")),
    ("obsq ui answers /, /healthz and /metrics",
     lambda: serves(["obsq", "ui", "--http-port", "{port}"], "/", "/healthz", "/metrics")),
]


def delete_namespace() -> None:
    import redis

    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(match=f"{NAMESPACE}:*", count=1000))
        if keys:
            client.delete(*keys)


def main() -> int:
    os.environ.update(OBSQ_REDIS_URL=REDIS_URL, OBSQ_NAMESPACE=NAMESPACE)
    try:
        for name, check in CHECKS:
            start = time.monotonic()
            try:
                check()
            except Exception as exc:
                if not isinstance(exc, Failure):
                    traceback.print_exc()
                print(f"smoke: FAIL {name}: {exc}", flush=True)
                return 1
            print(f"smoke: ok   {name} ({time.monotonic() - start:.1f} s)", flush=True)
    finally:
        delete_namespace()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
