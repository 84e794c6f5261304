"""Real OTLP export, over HTTP/protobuf and over gRPC, into receivers started here: a
producer process and an `obsq worker` process, each set up by setup_tracing() from OTEL_*
variables, give one trace from the producer's span to the handler's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest
from support import ObsqProcess, obsq_env, wait_until

from .helpers import ROOT, otel_env

APP = """
import os
import obsq
import obsq.observability

app = obsq.App(namespace=os.environ["OBSQ_NAMESPACE"])


@app.task("ok")
async def ok(task):
    return "fine"


@app.task("fail", max_retry=1, retry_delay=0)
async def fail(task):
    raise ValueError("card declined")
"""

PRODUCER = """
import asyncio, json, os
import obsq
import obsq.observability
from opentelemetry import trace
from obsq.observability import setup_tracing, shutdown_tracing
from otlp_app import app


async def main():
    obsq.observability.instrument_app(app)  # send spans for the clients built with it
    client = obsq.Client(os.environ["OBSQ_REDIS_URL"], app=app)
    with trace.get_tracer("shop").start_as_current_span("checkout"):
        ok = await client.enqueue("ok")
        bad = await client.enqueue("fail")
    await client.close()
    print(json.dumps({"ok": ok.id, "fail": bad.id}))

assert setup_tracing()
asyncio.run(main())
shutdown_tracing()
"""

PRODUCER_KIND, CONSUMER_KIND, STATUS_ERROR = 4, 5, 2  # OTLP enum values
# every fastotel release needs Python 3.11: the fasttrace extra brings nothing to 3.10
WITH_FASTOTEL = pytest.mark.skipif(sys.version_info < (3, 11),
                                   reason="fastotel needs Python 3.11 or newer")


@pytest.mark.parametrize(("protocol", "fastotel"), [pytest.param("http/protobuf", "true",
                                                                  marks=WITH_FASTOTEL),
                                                     ("http/protobuf", "false"),
                                                     ("grpc", "false")])
async def test_one_trace_across_processes(protocol, fastotel, otlp_receiver, redis_url,
                                          namespace, tmp_path):
    receiver = otlp_receiver(protocol)
    (tmp_path / "otlp_app.py").write_text(APP)
    (tmp_path / "producer.py").write_text(PRODUCER)
    base = {"OBSQ_REDIS_URL": redis_url, "OBSQ_NAMESPACE": namespace,
            "OBSQ_FASTOTEL": fastotel}  # true: fastotel must be installed (the fasttrace extra)
    worker = ObsqProcess(["worker", "otlp_app:app", "--concurrency", "4", "--http-port", "-1"],
                        obsq_env(**base, **otel_env(receiver, "test-worker")), tmp_path,
                        tmp_path / "worker.log")
    try:
        produced = await asyncio.to_thread(
            subprocess.run, [sys.executable, "producer.py"], cwd=tmp_path, timeout=60,
            env=obsq_env(**base, **otel_env(receiver, "test-producer")), capture_output=True)
        assert produced.returncode == 0, produced.stderr.decode()
        ids = json.loads(produced.stdout)
        await wait_until(lambda: len(receiver.named("process ")) == 3, timeout=30,
                         what="3 process spans")
    finally:
        code = await asyncio.to_thread(worker.stop)
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log, log

    (checkout,) = receiver.named("checkout")
    sends = {s["attributes"]["messaging.message.id"]: s for s in receiver.named("send ")}
    processes = receiver.named("process ")
    assert checkout["service"] == "test-producer"
    assert set(sends) == {ids["ok"], ids["fail"]}
    for send in sends.values():
        assert send["name"] == "send default" and send["kind"] == PRODUCER_KIND
        assert send["service"] == "test-producer" and send["scope"] == "obsq"
        assert send["trace_id"] == checkout["trace_id"]
        assert send["parent_id"] == checkout["span_id"]
        assert send["attributes"]["messaging.operation.type"] == "send"
    for process in processes:
        send = sends[process["attributes"]["messaging.message.id"]]
        assert process["service"] == "test-worker" and process["kind"] == CONSUMER_KIND
        assert process["trace_id"] == checkout["trace_id"]
        assert process["parent_id"] == send["span_id"]
        assert process["links"] == [(send["trace_id"], send["span_id"])]
        assert process["attributes"]["messaging.operation.name"] == "process"
        assert process["attributes"]["messaging.system"] == "obsq"
        assert process["attributes"]["messaging.operation.type"] == "process"
        assert process["attributes"]["messaging.destination.name"] == "default"
        assert process["attributes"]["obsq.task.type"] == send["attributes"]["obsq.task.type"]

    ok = [p for p in processes if p["attributes"]["messaging.message.id"] == ids["ok"]]
    assert [p["attributes"]["obsq.task.outcome"] for p in ok] == ["success"]
    assert ok[0]["status"] != STATUS_ERROR and ok[0]["events"] == []
    failed = sorted((p for p in processes if p["attributes"]["messaging.message.id"]
                     == ids["fail"]), key=lambda p: p["attributes"]["obsq.task.retry_count"])
    assert [p["attributes"]["obsq.task.outcome"] for p in failed] == ["retry", "dead"]
    for span, outcome in zip(failed, ("retry", "dead")):
        assert span["status"] == STATUS_ERROR
        assert span["status_message"] == "card declined"
        assert span["attributes"]["error.type"] == "ValueError"
        assert [e["name"] for e in span["events"]] == ["exception", outcome]
        exception = span["events"][0]["attributes"]
        assert exception["exception.type"] == "ValueError"
        assert exception["exception.message"] == "card declined"
        assert "Traceback" in exception["exception.stacktrace"]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, text=True,
                          env=obsq_env(**env), capture_output=True, timeout=60)


def test_setup_tracing_leaves_an_application_provider_alone():
    done = run_python("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from obsq.observability import setup_tracing
        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        assert setup_tracing() is False
        assert trace.get_tracer_provider() is mine
        print("kept")
    """, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert done.stdout.strip() == "kept", done.stderr


def test_setup_tracing_does_nothing_without_otel_variables():
    done = run_python("""
        from opentelemetry import trace
        from obsq.observability import setup_tracing
        assert setup_tracing() is False
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        print("untouched")
    """)
    assert done.stdout.strip() == "untouched", done.stderr


def test_setup_tracing_reads_the_standard_variables():
    done = run_python("""
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from obsq.observability import setup_tracing, shutdown_tracing
        assert setup_tracing() is True
        provider = trace.get_tracer_provider()
        assert provider.resource.attributes["service.name"] == "obsq-worker"
        assert provider.resource.attributes["deployment.environment"] == "test"
        assert type(provider.sampler).__name__ == "TraceIdRatioBased"
        (processor,) = provider._active_span_processor._span_processors
        assert isinstance(processor._batch_processor._exporter, OTLPSpanExporter)
        shutdown_tracing()
        print("configured")
    """, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5")
    assert done.stdout.strip() == "configured", done.stderr


@WITH_FASTOTEL
def test_otlp_over_http_goes_through_fastotel_only_when_asked():
    """fastotel is pre-alpha: installed, it is still not used unless OBSQ_FASTOTEL=true."""
    done = run_python("""
        import os, sys
        from obsq.errors import ConfigurationError
        from obsq.observability.tracing import _processor
        import fastotel  # installed (the fasttrace extra)
        assert type(_processor("otlp")).__name__ == "BatchSpanProcessor"  # unset: the SDK's
        os.environ["OBSQ_FASTOTEL"] = ""  # empty: as if unset
        assert type(_processor("otlp")).__name__ == "BatchSpanProcessor"
        os.environ["OBSQ_FASTOTEL"] = "false"
        assert type(_processor("otlp")).__name__ == "BatchSpanProcessor"
        os.environ["OBSQ_FASTOTEL"] = "true"
        assert type(_processor("otlp")).__module__.startswith("fastotel.")
        def refused(setting, said):
            os.environ["OBSQ_FASTOTEL"] = setting
            try:
                _processor("otlp")
            except ConfigurationError as e:
                return said in str(e)
            return False
        assert refused("maybe", "OBSQ_FASTOTEL")
        sys.modules["fastotel"] = None  # as if it were not installed
        assert refused("true", "pip install 'obsq[fasttrace]'")  # missing, and required
        print("chosen")
    """, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert done.stdout.strip() == "chosen", done.stderr
