"""The OpenTelemetry messaging conventions' metrics, pushed over OTLP for platforms built on
the OpenTelemetry Collector, when OTEL_METRICS_EXPORTER asks (`otlp`, or `console`).

Prometheus stays the default and needs none of this. One bookkeeping feeds both: the
worker's task metrics (metrics.TaskMetrics) and the producer's (enqueue_metrics) record
into MessagingMeters beside their Prometheus series, and the queue-wide gauges come from
the same QueueCollector read, observed as OTel gauges.

- `messaging.process.duration` (s, histogram): a handler run, `error.type` when it raised;
- `messaging.client.consumed.messages`: tasks a worker took to run;
- `messaging.client.sent.messages`: tasks a producer wrote (`error.type` when it failed);
- `messaging.client.operation.duration` (s, histogram): a producer's send, one call of one
  or more tasks;
- `obsq.queue.depth`, `obsq.queue.latency`, ...: the queue-wide gauges of /metrics, named
  with dots, their `queue` label as `messaging.destination.name`.

Each carries `messaging.system`, `messaging.operation.name` and, where one queue is meant,
`messaging.destination.name`.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from obsq._version import __version__
from obsq.errors import ConfigurationError
from obsq.observability.metrics import BUCKETS
from obsq.observability.tracing import (
    OTLP_EXTRA,
    SCHEMA_URL,
    SYSTEM,
    error_type,
    installed,
    otlp_protocol,
    resource,
)

if TYPE_CHECKING:
    from obsq.observability.collector import QueueCollector
    from obsq.task import TaskMessage

log = logging.getLogger("obsq")

EXPORTER_ENV = "OTEL_METRICS_EXPORTER"
Attributes = dict[str, str]
Key = tuple[str, str, str]  # (messaging.operation.name, destination, error.type), "" if none
_provider: Any = None
_meters: MessagingMeters | None = None


def requested_exporters() -> list[str]:
    """The metric exporters OTEL_METRICS_EXPORTER names (`otlp`, `console`); none when it is
    unset or `none`, or when OTEL_SDK_DISABLED is true."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return []
    named = [e.strip() for e in os.environ.get(EXPORTER_ENV, "").split(",")]
    return [e for e in named if e and e != "none"]


def missing_for_export() -> str | None:
    """What OTEL_METRICS_EXPORTER asks to push metrics with that is not installed, said with
    how to install it; None when nothing is missing or nothing is asked."""
    exporters = requested_exporters()
    if not exporters:
        return None
    needed = ["opentelemetry.sdk.metrics"]
    if "otlp" in exporters:
        needed.append("opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
                      if otlp_protocol("METRICS") == "grpc"
                      else "opentelemetry.exporter.otlp.proto.http.metric_exporter")
    missing = [module for module in needed if not installed(module)]
    if not missing:
        return None
    return (f"metrics: {EXPORTER_ENV}={','.join(exporters)} asks for metrics to be pushed, "
            f"but the OpenTelemetry SDK or its exporter is not installed (no module "
            f"{', '.join(missing)}): no metric is pushed over OTLP (Prometheus's /metrics "
            f"still serves them); {OTLP_EXTRA}")


def setup_otel_metrics(service_name: str = "obsq-worker") -> bool:
    """Push the messaging metrics as OTEL_METRICS_EXPORTER says; returns True if it set up a
    meter provider. Nothing happens when no exporter is asked, or when the application set
    its own provider (obsq's meters then use it). The SDK reads the details itself:
    OTEL_METRIC_EXPORT_INTERVAL, and the endpoint, headers and timeout of
    OTEL_EXPORTER_OTLP_*; OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL picks `http/protobuf` (the
    default) or `grpc`."""
    global _provider
    exporters = requested_exporters()
    if not exporters:
        return False
    # the API's own providers (the proxy before one is set, the no-op) live in its module
    if not type(metrics.get_meter_provider()).__module__.startswith("opentelemetry.metrics"):
        log.info("metrics: the application set its own meter provider; obsq uses it")
        return False
    missing = missing_for_export()
    if missing:
        log.warning(missing)
        return False

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    readers = [PeriodicExportingMetricReader(_exporter(name)) for name in exporters]
    provider = MeterProvider(metric_readers=readers, resource=resource(service_name))
    metrics.set_meter_provider(provider)
    if metrics.get_meter_provider() is not provider:  # another thread won the race
        provider.shutdown()
        return False
    _provider = provider
    atexit.register(shutdown_otel_metrics)
    log.info("metrics: pushing the messaging metrics (%s)", ", ".join(exporters))
    return True


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if name != "otlp":
        raise ConfigurationError(f"{EXPORTER_ENV}={name!r}: obsq supports otlp, console or "
                                 "none")
    protocol = otlp_protocol("METRICS")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc

        return grpc.OTLPMetricExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http import metric_exporter as http

        return http.OTLPMetricExporter()
    raise ConfigurationError(f"OTLP protocol {protocol!r} is not supported: use grpc or "
                             "http/protobuf")


def shutdown_otel_metrics(timeout_millis: float = 10_000) -> None:
    """Push what is pending and stop the provider setup_otel_metrics installed (once)."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown(timeout_millis)


def messaging_meters() -> MessagingMeters | None:
    """The process's meters when metrics are pushed (OTEL_METRICS_EXPORTER), else None: a
    plain install records nothing twice."""
    global _meters
    if _meters is None and requested_exporters():
        _meters = MessagingMeters()
    return _meters


class MessagingMeters:
    """The conventions' instruments. The counters are counted here, a dict increment a
    task, and observed by the SDK when it pushes (its own `add` costs a task as much as a
    no-op handler's whole run); the histograms are recorded as they come. Attribute sets
    are made once per queue (and error type) and kept."""

    def __init__(self, meter: metrics.Meter | None = None) -> None:
        meter = meter or metrics.get_meter("obsq", __version__, schema_url=SCHEMA_URL)
        self.meter = meter
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="Duration of processing "
            "operation (a handler run)", explicit_bucket_boundaries_advisory=BUCKETS)
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s", description="Duration of "
            "messaging operation initiated by a producer or consumer client",
            explicit_bucket_boundaries_advisory=BUCKETS)
        self._consumed: dict[Key, int] = {}
        self._sent: dict[Key, int] = {}
        meter.create_observable_counter(
            "messaging.client.consumed.messages", [self._observer(self._consumed)],
            unit="{message}", description="Number of messages that were delivered to the "
            "application")
        meter.create_observable_counter(
            "messaging.client.sent.messages", [self._observer(self._sent)],
            unit="{message}", description="Number of messages producer attempted to send to "
            "the broker")
        self._attributes: dict[Key, Attributes] = {}

    def attributes(self, key: Key) -> Attributes:
        """The attribute set of (operation, queue, error type)."""
        made = self._attributes.get(key)
        if made is None:
            operation, queue, error = key
            made = {"messaging.system": SYSTEM, "messaging.operation.name": operation}
            if queue:
                made["messaging.destination.name"] = queue
            if error:
                made["error.type"] = error
            if len(self._attributes) < 10_000:  # queue names made per tenant are unbounded
                self._attributes[key] = made
        return made

    def _observer(self, counts: dict[Key, int]) -> Any:
        def observe(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            # list(): one step under the GIL, while the event loop's thread counts on
            return [metrics.Observation(n, self.attributes(key))
                    for key, n in list(counts.items())]
        return observe

    def started(self, queue: str) -> None:
        """A worker took a task of `queue` to run."""
        key = ("process", queue, "")
        self._consumed[key] = self._consumed.get(key, 0) + 1

    def processed(self, queue: str, seconds: float, error: BaseException | None) -> None:
        """A handler run of `seconds` ended, raising `error` or not."""
        self.process_duration.record(seconds, self.attributes(
            ("process", queue, error_type(error) if error is not None else "")))

    def sent_messages(self, messages: list[TaskMessage], seconds: float,
                      error: BaseException | None) -> None:
        """One producer call wrote `messages`, or failed with `error`, in `seconds` (a
        duplicate that Redis already had counts as sent)."""
        failed = error_type(error) if error is not None else ""
        queues: set[str] = set()
        for m in messages:
            key = ("send", m.queue, failed)
            self._sent[key] = self._sent.get(key, 0) + 1
            queues.add(m.queue)
        self.operation_duration.record(seconds, self.attributes(
            ("send", queues.pop() if len(queues) == 1 else "", failed)))

    def observe_queues(self, collector: QueueCollector) -> None:
        """The collector's queue-wide gauges as OTel gauges (one read serves a scrape and a
        push: the collector caches it for a second)."""
        for family in collector.describe():
            self.meter.create_observable_gauge(
                family.name.replace("_", "."), callbacks=[_observer(collector, family.name)],
                description=family.documentation)


def _observer(collector: QueueCollector, name: str) -> Any:
    def observe(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for family in collector.collect():
            if family.name != name:
                continue
            for sample in family.samples:
                labels = dict(sample.labels)
                if "queue" in labels:
                    labels["messaging.destination.name"] = labels.pop("queue")
                yield metrics.Observation(sample.value, labels)
    return observe
