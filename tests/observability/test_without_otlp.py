"""obsq as a plain install has it, the OpenTelemetry API alone: the SDK and the exporters come
with the `otlp` extra. Each process here runs with those modules hidden (a sitecustomize on
PYTHONPATH whose finder refuses them, as if they were not installed): a producer still
enqueues, and a worker whose OTEL_* variables ask to export says at start that it cannot and
how to install what it needs, as `obsq doctor` does, rather than dropping the spans unsaid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import ObsqProcess, obsq_env, run_obsq, wait_for

HIDING = '''
import os
import sys

HIDDEN = tuple(os.environ["HIDDEN_MODULES"].split(","))


class NotInstalled:
    """Refuses the hidden modules and everything under them."""

    def find_spec(self, name, path=None, target=None):
        if any(name == module or name.startswith(module + ".") for module in HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''
SDK_AND_EXPORTERS = "opentelemetry.sdk,opentelemetry.exporter,opentelemetry.instrumentation"
ENDPOINT = "http://127.0.0.1:9"  # nothing listens: no span may be sent anyway
OTLP_EXTRA = "pip install 'obsq[otlp]'"

APP = """
import os

import obsq

app = obsq.App(namespace=os.environ["OBSQ_NAMESPACE"])


@app.task("add")
async def add(task):
    return sum(task.payload)
"""


@pytest.fixture
def plain(tmp_path: Path):
    """The environment of a process that finds `hidden` not installed, and `extra`."""
    (tmp_path / "hiding").mkdir()
    (tmp_path / "hiding" / "sitecustomize.py").write_text(HIDING)

    def environment(hidden: str = SDK_AND_EXPORTERS, **extra: str) -> dict[str, str]:
        env = obsq_env(HIDDEN_MODULES=hidden, **extra)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hiding"), env["PYTHONPATH"]])
        return env

    return environment


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def test_a_producer_enqueues_with_the_api_alone(plain, redis_url, namespace, tmp_path):
    done = run_python("""
        import importlib.util, os, sys
        import obsq
        from obsq.observability import instrument_app
        app = obsq.App()
        instrument_app(app)  # its send spans go to the API's no-op provider
        with obsq.SyncClient(os.environ["OBSQ_REDIS_URL"], app=app,
                             namespace=os.environ["OBSQ_NAMESPACE"]) as client:
            info = client.enqueue("add", [1, 2])
        assert importlib.util.find_spec("opentelemetry") is not None
        try:
            import opentelemetry.sdk
        except ModuleNotFoundError:
            print("enqueued", info.id is not None)
    """, plain(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace), tmp_path)
    assert done.stdout.strip() == "enqueued True", done.stderr


def test_a_worker_told_to_export_says_at_start_what_to_install(plain, redis_url, namespace,
                                                               tmp_path):
    (tmp_path / "plain_app.py").write_text(APP)
    worker = ObsqProcess(["worker", "plain_app:app", "--http-port", "-1"],
                         plain(OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace,
                               OTEL_EXPORTER_OTLP_ENDPOINT=ENDPOINT),
                         tmp_path, tmp_path / "worker.log")
    try:
        wait_for(lambda: " started: queues " in worker.log(), timeout=30,
                 what="the worker started")
        assert worker.stop() == 0, worker.log()
    finally:
        worker.close()
    log = worker.log()
    (warning,) = [line for line in log.splitlines() if OTLP_EXTRA in line]
    assert "WARNING" in warning, log
    assert "OTEL_EXPORTER_OTLP_ENDPOINT asks for spans to be exported (otlp)" in warning
    assert "no span is exported" in warning and "opentelemetry.sdk.trace" in warning
    assert "Traceback" not in log, log


def test_each_missing_exporter_is_named(plain, tmp_path):
    """The SDK there and the exporter of the protocol asked for missing; the other protocol's
    missing, nothing said; nothing asked, nothing said."""
    code = """
        from obsq.observability.tracing import missing_for_export, setup_tracing
        print(missing_for_export())
        print(setup_tracing())
    """
    grpc = run_python(code, plain("opentelemetry.exporter.otlp.proto.grpc",
                                  OTEL_EXPORTER_OTLP_ENDPOINT=ENDPOINT,
                                  OTEL_EXPORTER_OTLP_PROTOCOL="grpc"), tmp_path)
    said, setup = grpc.stdout.splitlines()
    assert "(no module opentelemetry.exporter.otlp.proto.grpc.trace_exporter)" in said
    assert OTLP_EXTRA in said and setup == "False"
    assert said in grpc.stderr  # logged as a warning
    http = run_python(code, plain("opentelemetry.exporter.otlp.proto.grpc",
                                  OTEL_EXPORTER_OTLP_ENDPOINT=ENDPOINT,
                                  OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"), tmp_path)
    assert http.stdout.splitlines() == ["None", "True"], http.stderr
    untold = run_python(code, plain(), tmp_path)
    assert untold.stdout.splitlines() == ["None", "False"] and untold.stderr == "", (
        untold.stderr)


def test_doctor_says_it_as_a_notice(plain, redis_url, namespace):
    env = plain(OTEL_EXPORTER_OTLP_ENDPOINT=ENDPOINT)
    said = run_obsq("doctor", "--redis-url", redis_url, "--namespace", namespace, env=env)
    assert said.returncode == 0, said.stderr
    (notice,) = [line for line in said.stdout.splitlines() if OTLP_EXTRA in line]
    assert notice.startswith("notice: tracing: OTEL_EXPORTER_OTLP_ENDPOINT asks")
    strict = run_obsq("doctor", "--redis-url", redis_url, "--namespace", namespace,
                      "--strict", "--json", env=env)
    assert strict.returncode == 1
    assert [n for n in json.loads(strict.stdout)["notices"] if OTLP_EXTRA in n]
    quiet = run_obsq("doctor", "--redis-url", redis_url, "--namespace", namespace,
                     env=plain())
    assert quiet.returncode == 0 and OTLP_EXTRA not in quiet.stdout


def test_the_instrumentor_says_what_to_install(plain, tmp_path):
    done = run_python("import obsq.observability.instrumentor", plain(), tmp_path)
    assert done.returncode != 0
    assert ("ImportError: obsq's instrumentor needs opentelemetry-instrumentation"
            in done.stderr and OTLP_EXTRA in done.stderr), done.stderr
