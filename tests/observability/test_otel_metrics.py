"""The messaging conventions' metrics pushed over real OTLP (HTTP/protobuf) into a receiver
started here, with OTEL_METRICS_EXPORTER=otlp: an `obsq worker` process (handler runs,
consumed tasks, its queue gauges) and a producer process (sent tasks, each call's duration),
while /metrics serves the same counts to Prometheus."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from support import ObsqProcess, obsq_env, wait_until

from .helpers import otel_env, parse, scrape, value
from .test_otlp import APP, run_python

PRODUCER = """
import asyncio, os
import obsq
import obsq.observability
from obsq.observability import setup_otel_metrics, shutdown_otel_metrics
from otlp_app import app


async def main():
    obsq.observability.instrument_app(app)
    client = obsq.Client(os.environ["OBSQ_REDIS_URL"], app=app)
    await client.enqueue("ok")
    await client.enqueue_many([obsq.Job("ok"), obsq.Job("fail")])
    await client.close()

assert setup_otel_metrics("test-producer")
asyncio.run(main())
shutdown_otel_metrics()
"""

SCHEMA = "https://opentelemetry.io/schemas/1.27.0"


def metrics_env(receiver, service: str) -> dict[str, str]:
    return {**otel_env(receiver, service), "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_TRACES_EXPORTER": "none", "OTEL_METRIC_EXPORT_INTERVAL": "300"}


async def test_worker_and_producer_push_the_messaging_metrics(otlp_receiver, redis_url,
                                                              namespace, unused_tcp_port, tmp_path):
    receiver = otlp_receiver("http/protobuf")
    (tmp_path / "otlp_app.py").write_text(APP)
    (tmp_path / "producer.py").write_text(PRODUCER)
    base = {"OBSQ_REDIS_URL": redis_url, "OBSQ_NAMESPACE": namespace}
    port = unused_tcp_port
    worker = ObsqProcess(["worker", "otlp_app:app", "--concurrency", "2", "--http-port",
                          str(port)], obsq_env(**base, **metrics_env(receiver, "test-worker")),
                         tmp_path, tmp_path / "worker.log")
    try:
        produced = await asyncio.to_thread(
            subprocess.run, [sys.executable, "producer.py"], cwd=tmp_path, timeout=60,
            env=obsq_env(**base, **metrics_env(receiver, "test-producer")),
            capture_output=True)
        assert produced.returncode == 0, produced.stderr.decode()

        await wait_until(lambda: _total(receiver, "messaging.process.duration",
                                        "test-worker") >= 4, timeout=30,
                         what="4 handler runs pushed (ok twice, fail twice)")
        scraped = parse(scrape(port))
    finally:
        code = await asyncio.to_thread(worker.stop)
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log, log

    runs = _latest(receiver, "messaging.process.duration", "test-worker")
    ok = {"messaging.system": "obsq", "messaging.operation.name": "process",
          "messaging.destination.name": "default"}
    assert runs[_key(ok)] == 2
    assert runs[_key({**ok, "error.type": "ValueError"})] == 2  # the attempt and its retry
    consumed = _latest(receiver, "messaging.client.consumed.messages", "test-worker")
    assert consumed == {_key(ok): 4}
    (point, *_) = receiver.metric("messaging.process.duration")
    assert point["unit"] == "s" and point["schema_url"] == SCHEMA
    # the same bookkeeping served to Prometheus
    assert value(scraped, "obsq_tasks_processed_total", queue="default", task="fail",
                 outcome="dead") == 1

    sent = _latest(receiver, "messaging.client.sent.messages", "test-producer")
    assert sent == {_key({"messaging.system": "obsq", "messaging.operation.name": "send",
                          "messaging.destination.name": "default"}): 3}
    calls = _latest(receiver, "messaging.client.operation.duration", "test-producer")
    assert sum(calls.values()) == 2  # one enqueue, one enqueue_many

    depth = receiver.metric("obsq.queue.depth", **{"messaging.destination.name": "default"})
    assert depth and {p["attributes"]["state"] for p in depth} >= {"pending", "dead"}
    assert any(p["value"] == 1 for p in depth if p["attributes"]["state"] == "dead")


def _key(attributes: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(attributes.items()))


def _latest(receiver, name: str, service: str | None = None) -> dict[tuple, float]:
    """Each series' last pushed value (a histogram's count): cumulative, so the whole."""
    latest: dict[tuple, float] = {}
    for p in receiver.metric(name):
        if service is None or p["service"] == service:
            latest[_key(p["attributes"])] = p.get("count", p.get("value"))
    return latest


def _total(receiver, name: str, service: str) -> float:
    return sum(_latest(receiver, name, service).values())


def test_nothing_is_pushed_unless_asked():
    """Without OTEL_METRICS_EXPORTER: no meter provider is set up and no meter records."""
    done = run_python("""
        from opentelemetry import metrics
        from obsq.observability import setup_otel_metrics
        from obsq.observability.otel_metrics import messaging_meters
        assert setup_otel_metrics() is False
        assert messaging_meters() is None
        assert type(metrics.get_meter_provider()).__module__.startswith("opentelemetry.metrics")
        print("untouched")
    """, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert done.stdout.strip() == "untouched", done.stderr


def test_an_application_meter_provider_is_kept():
    done = run_python("""
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from obsq.observability import setup_otel_metrics
        mine = MeterProvider()
        metrics.set_meter_provider(mine)
        assert setup_otel_metrics() is False
        assert metrics.get_meter_provider() is mine
        print("kept")
    """, OTEL_METRICS_EXPORTER="otlp")
    assert done.stdout.strip() == "kept", done.stderr


def test_a_wrong_exporter_is_refused_by_name():
    done = run_python("""
        from obsq.errors import ConfigurationError
        from obsq.observability import setup_otel_metrics
        try:
            setup_otel_metrics()
        except ConfigurationError as exc:
            print(exc)
    """, OTEL_METRICS_EXPORTER="prometheus")
    assert "OTEL_METRICS_EXPORTER='prometheus'" in done.stdout, done.stderr
