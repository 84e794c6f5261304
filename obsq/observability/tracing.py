"""OpenTelemetry tracing after the messaging conventions, and its exporter set-up.

Producer: a `send {queue}` PRODUCER span for one message, a child of the caller's context,
whose W3C `traceparent`/`tracestate`/`baggage` go into the message's headers through the
global propagator; a batch (`enqueue_many`, a published event's copies) gets a `create
{queue}` PRODUCER span per message (the context each message carries) and one `send` CLIENT
span linked to them with `messaging.batch.message_count`; with create spans off
(OBSQ_TRACE_CREATE_SPANS=false) a batch is one `send` PRODUCER span whose context every
message carries. Each Client's spans name its Redis (`server.address`, `server.port`) and
its id (`messaging.client.id`), whether instrumented itself or through its App. Worker: a
`process {queue}` CONSUMER span around the middleware and handler, linked to the message's
creation context and its child, or in a new trace when `OBSQ_TRACE_LINK=true` (or
`link=True`) and for each copy of a published event (every subscriber's work is a trace of
its own). The process span stays open until the outcome hook reports how Redis recorded the
attempt, so it covers the settle; that hook ends it whatever the outcome (retry and dead
become span events, and the final outcome an attribute). A failure sets `error.type` and the
status, whose description is the message.

Exporting: `setup_tracing()` installs an SDK TracerProvider with a batch OTLP exporter
when `OTEL_*` variables ask for one, unless the application already set a provider; OTLP
over HTTP goes through fastotel's native span processor when OBSQ_FASTOTEL=true. The SDK
and the exporters come with the `otlp` extra (a plain install has the API alone): asked to
export without them, it logs a warning that says how to install them (`missing_for_export`,
which `obsq doctor` reports too), never dropping the spans unsaid.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from obsq._version import __version__
from obsq.app import CallNextProducer
from obsq.errors import ConfigurationError
from obsq.names import partition_index
from obsq.producer.fanout import EVENT_HEADER
from obsq.settings import env_flag
from obsq.task import Task, TaskInfo, TaskMessage

if TYPE_CHECKING:
    from obsq.producer.client import Client

log = logging.getLogger("obsq")

SYSTEM = "obsq"
SPAN_KEY = "obsq.span"  # where the process span waits in task.context for the outcome
RECORDED_KEY = "obsq.span.error"
LINK_ENV = "OBSQ_TRACE_LINK"
CREATE_SPANS_ENV = "OBSQ_TRACE_CREATE_SPANS"
# The version of the OpenTelemetry semantic conventions the spans and metrics follow
# (messaging.operation.type `send`, messaging.client.id, the messaging metrics' names).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
MAX_LINKS = 128  # the SDK keeps 128 links a span by default
DEFAULT_PORT = 6379


def _tracer() -> trace.Tracer:
    # A proxy until a provider is set; it then resolves once and stays cheap.
    return trace.get_tracer("obsq", __version__, schema_url=SCHEMA_URL)


def error_type(exc: BaseException) -> str:
    """`error.type`: the exception's fully qualified class name (builtins by their name)."""
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"


def _record_error(span: trace.Span, exc: BaseException) -> None:
    """The exception event, `error.type`, and a status whose description is the message
    only (the type is in `error.type`)."""
    span.record_exception(exc)
    span.set_attribute("error.type", error_type(exc))
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200] or None))


def connection_attributes(redis_url: str | None, client_id: str | None) -> dict[str, Any]:
    """`server.address`/`server.port` of the Redis a URL names (its first host; a unix
    socket's path) and `messaging.client.id`, for every span of one client or worker."""
    attributes: dict[str, Any] = {}
    if client_id:
        attributes["messaging.client.id"] = client_id
    if redis_url:
        parts = urlsplit(redis_url)
        if parts.scheme == "unix":
            attributes["server.address"] = parts.path
        else:
            first = parts.netloc.rpartition("@")[2].split(",")[0]  # a Sentinel URL's first
            host, port = (first, "") if first.endswith("]") or ":" not in first \
                else first.rsplit(":", 1)
            if host:
                attributes["server.address"] = host.strip("[]")
                attributes["server.port"] = int(port) if port.isdigit() else DEFAULT_PORT
    return attributes


class TaskTracing:
    """The middleware and outcome hook that one App gets. `attributes`: those of the worker
    (connection_attributes), on every process span."""

    def __init__(self, *, link: bool | None = None, tracer: trace.Tracer | None = None,
                 attributes: dict[str, Any] | None = None) -> None:
        self.tracer = tracer or _tracer()
        self.link = env_flag(LINK_ENV) if link is None else link
        self.attributes = dict(attributes or {})
        self._names: dict[str, str] = {}

    async def middleware(self, task: Task, call_next: Callable[[Task], Any]) -> Any:
        headers = task.headers
        parent = propagate.extract(headers) if headers else otel_context.Context()
        links = None
        creation = trace.get_current_span(parent).get_span_context()
        if creation.is_valid:  # always linked to the message's creation context
            links = (Link(creation),)
            if self.link or EVENT_HEADER in headers:  # an event's copy: a trace of its own
                parent = trace.set_span_in_context(trace.INVALID_SPAN, parent)  # keep baggage
        name = self._names.get(task.queue)
        if name is None:
            name = self._names[task.queue] = f"process {task.queue}"
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": task.queue,
            "messaging.message.id": task.id,
            "obsq.task.type": task.type,
            "obsq.task.retry_count": task.retry_count,
            **self.attributes,
        }
        if task.partition:
            placed = partition_index(task.partition)
            if placed is not None:
                attributes["messaging.destination.partition.id"] = str(placed[0])
        span = self.tracer.start_span(name, parent, SpanKind.CONSUMER, attributes, links)
        task.context[SPAN_KEY] = span
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            return await call_next(task)
        except Exception as exc:
            _record_error(span, exc)
            task.context[RECORDED_KEY] = True
            raise
        finally:
            otel_context.detach(token)

    def on_outcome(self, task: Task, outcome: str, error: BaseException | None) -> None:
        span = task.context.pop(SPAN_KEY, None)
        if span is None:
            return
        if outcome != "success":
            if error is not None and not task.context.get(RECORDED_KEY):
                # e.g. a result that is not JSON: the failure came after the handler
                _record_error(span, error)
            span.add_event(outcome)
        span.set_attribute("obsq.task.outcome", outcome)
        span.end()


class SendTracing:
    """The producer hook of a Client: one `send {queue}` span for one message, whose
    context the message carries; for a batch, a `create {queue}` span per message (the
    context it carries) and one `send` span linked to them, with the batch's size, as the
    messaging conventions describe a batch (`create_spans`: default OBSQ_TRACE_CREATE_SPANS,
    on; off, a batch's messages carry its `send` span's context). `attributes`: the
    Client's (connection_attributes), on every span. An App's instance is made again for
    each Client built with it (`obsq_for_client`), so that every span names its Client."""

    obsq_sync_safe = True  # awaits only call_next: a SyncClient runs it in its caller's thread

    def __init__(self, tracer: trace.Tracer | None = None,
                 attributes: dict[str, Any] | None = None,
                 create_spans: bool | None = None) -> None:
        self.tracer = tracer or _tracer()
        self.attributes = dict(attributes or {})
        self.create_spans = env_flag(CREATE_SPANS_ENV, default=True) if create_spans is None \
            else create_spans
        self._clients: weakref.WeakKeyDictionary[Client, SendTracing] = \
            weakref.WeakKeyDictionary()

    def obsq_for_client(self, client: Client) -> SendTracing:
        """This hook for one Client: its spans name the Client's Redis and id."""
        made = self._clients.get(client)
        if made is None:
            made = self._clients[client] = SendTracing(self.tracer, {
                **self.attributes,
                **connection_attributes(client.broker.url, client.results.client_id)},
                self.create_spans)
        return made

    def _message_span(self, operation: str, m: TaskMessage, parent: otel_context.Context
                      ) -> trace.Span:
        span = self.tracer.start_span(f"{operation} {m.queue}", parent, SpanKind.PRODUCER, {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": operation,
            "messaging.destination.name": m.queue,
            "messaging.message.id": m.id,
            "obsq.task.type": m.type,
            **self.attributes,
        }, _origin_links(m.origins) if m.origins else None)
        propagate.inject(m.headers, trace.set_span_in_context(span, parent))
        return span

    def _batch_span(self, messages: list[TaskMessage], creates: list[trace.Span],
                    parent: otel_context.Context) -> trace.Span:
        """The batch's `send` span: a CLIENT span linked to the create spans whose contexts
        the messages carry, or without them the PRODUCER span whose context they carry."""
        queues = {m.queue for m in messages}
        attributes = {"messaging.system": SYSTEM, "messaging.operation.name": "send",
                      "messaging.operation.type": "send",
                      "messaging.batch.message_count": len(messages), **self.attributes}
        name = "send"
        if len(queues) == 1:
            name = f"send {messages[0].queue}"
            attributes["messaging.destination.name"] = messages[0].queue
        if not creates:
            span = self.tracer.start_span(name, parent, SpanKind.PRODUCER, attributes)
            carried = trace.set_span_in_context(span, parent)
            for m in messages:
                propagate.inject(m.headers, carried)
            return span
        links = [Link(c.get_span_context()) for c in creates[:MAX_LINKS]]
        return self.tracer.start_span(name, parent, SpanKind.CLIENT, attributes, links)

    async def __call__(self, messages: list[TaskMessage],
                       call_next: CallNextProducer) -> list[TaskInfo]:
        parent = otel_context.get_current()
        if len(messages) == 1:
            send = self._message_span("send", messages[0], parent)
            creates = [send]
        else:
            creates = [self._message_span("create", m, parent) for m in messages] \
                if self.create_spans else []
            send = self._batch_span(messages, creates, parent)
        try:
            infos = await call_next(messages)
        except BaseException as exc:
            if isinstance(exc, Exception):
                _record_error(send, exc)
            _end(creates, send)
            raise
        for span, info in zip(creates, infos):
            if info.duplicate:
                span.set_attribute("obsq.task.duplicate", True)
            elif info.debounced:
                span.set_attribute("obsq.task.debounced", info.id)
        _end(creates, send)
        return infos


def _end(creates: list[trace.Span], send: trace.Span) -> None:
    for span in creates:
        if span is not send:
            span.end()
    send.end()


def _origin_links(origins: list[dict[str, str]]) -> list[Link]:
    """Links to the traces of the tasks a task was made of (an aggregation's batch), as
    the messaging conventions link a batch; at most MAX_LINKS."""
    links = []
    for headers in origins:
        context = trace.get_current_span(propagate.extract(headers)).get_span_context()
        if context.is_valid:
            links.append(Link(context))
            if len(links) == MAX_LINKS:
                break
    return links


# -- exporting ---------------------------------------------------------------------------

EXPORTER_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_TRACES_EXPORTER")
OTLP_EXTRA = "pip install 'obsq[otlp]'"
_provider: Any = None


def requested_exporters() -> list[str]:
    """The span exporters the `OTEL_*` variables ask for: none when no exporter variable is
    set, when OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is none."""
    env = os.environ
    if not any(env.get(name) for name in EXPORTER_ENV):
        return []
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return []
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    return [e for e in exporters if e and e != "none"]


def otlp_protocol(signal: str = "TRACES") -> str:
    """OTEL_EXPORTER_OTLP_<signal>_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL (`signal`:
    TRACES or METRICS), http/protobuf by default."""
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a package above it is missing
        return False


def missing_for_export() -> str | None:
    """What the `OTEL_*` variables ask to export spans with that is not installed, said with
    the variable that asks and how to install it; None when nothing is missing or nothing
    is asked. obsq's plain install makes spans with the OpenTelemetry API alone."""
    exporters = requested_exporters()
    if not exporters:
        return None
    needed = ["opentelemetry.sdk.trace"]
    if "otlp" in exporters:
        protocol = otlp_protocol()
        if protocol == "grpc":
            needed.append("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        elif protocol == "http/protobuf" and not env_flag("OBSQ_FASTOTEL"):
            needed.append("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    missing = [module for module in needed if not installed(module)]
    if not missing:
        return None
    asking = next(name for name in EXPORTER_ENV if os.environ.get(name))
    return (f"tracing: {asking} asks for spans to be exported ({', '.join(exporters)}), but "
            f"the OpenTelemetry SDK or its exporter is not installed (no module "
            f"{', '.join(missing)}): no span is exported; {OTLP_EXTRA}")


def setup_tracing(service_name: str = "obsq-worker") -> bool:
    """Export spans as the standard `OTEL_*` variables say; returns True if it set up a
    provider. Nothing happens when no exporter variable is set, when OTEL_SDK_DISABLED is
    true or OTEL_TRACES_EXPORTER is none, or when the application set its own provider;
    a warning says so when the SDK or the exporter is not installed (the otlp extra).

    The SDK reads the details itself: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES (the
    service name defaults to `service_name`), OTEL_TRACES_SAMPLER(_ARG), OTEL_BSP_*, and
    the endpoint, headers, timeout, compression and certificates of OTEL_EXPORTER_OTLP_*.
    OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL picks `http/protobuf` (the default, port 4318) or
    `grpc` (port 4317)."""
    global _provider
    exporters = requested_exporters()
    if not exporters:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        log.info("tracing: the application set its own tracer provider; obsq uses it")
        return False
    missing = missing_for_export()
    if missing:
        log.warning(missing)
        return False

    from opentelemetry.sdk.trace import TracerProvider

    made = resource(service_name)
    provider = TracerProvider(resource=made)  # the sampler comes from OTEL_TRACES_SAMPLER
    processors = [_processor(name) for name in exporters]
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # another thread won the race
        provider.shutdown()
        return False
    _provider = provider
    atexit.register(shutdown_tracing)
    log.info("tracing: exporting spans (%s) as service %s, through %s", ", ".join(exporters),
             made.attributes.get("service.name"),
             ", ".join(type(p).__module__.split(".")[0] for p in processors))
    return True


def resource(service_name: str) -> Any:
    """The SDK's Resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, the service
    named `service_name` unless they name it (spans and pushed metrics share it)."""
    from opentelemetry.sdk.resources import Resource

    env = os.environ
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    return Resource.create({} if named else {"service.name": service_name})


def _processor(name: str) -> Any:
    """The span processor of one exporter. OTLP over HTTP goes through fastotel's native
    processor when OBSQ_FASTOTEL=true (`obsq[fasttrace]`): it
    batches, encodes and sends spans on a thread of its own that never takes the GIL, where
    the SDK's protobuf encoding costs the worker more than the span itself. Both read the
    same OTEL_EXPORTER_OTLP_* and OTEL_BSP_* variables."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return BatchSpanProcessor(ConsoleSpanExporter())
    if name != "otlp":
        raise ConfigurationError(f"OTEL_TRACES_EXPORTER={name!r}: obsq supports otlp, console "
                                 "or none")
    protocol = otlp_protocol()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return BatchSpanProcessor(GrpcExporter())
    if protocol == "http/protobuf":
        native = _fastotel_processor()
        if native is not None:
            return native
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return BatchSpanProcessor(HttpExporter())
    raise ConfigurationError(f"OTLP protocol {protocol!r} is not supported: use grpc or "
                             "http/protobuf")


def _fastotel_processor() -> Any:
    """fastotel's OTLPSpanProcessor when OBSQ_FASTOTEL=true (it is pre-alpha: never chosen
    just because it is installed), else None; asked for and missing, an error rather than a
    quiet fallback."""
    if not env_flag("OBSQ_FASTOTEL"):
        return None
    try:
        from fastotel import OTLPSpanProcessor
    except ImportError:
        raise ConfigurationError("OBSQ_FASTOTEL=true, but fastotel is not installed: "
                                 "pip install 'obsq[fasttrace]' (Python 3.11 or newer)"
                                 ) from None
    return OTLPSpanProcessor()


def shutdown_tracing(timeout_millis: int = 10_000) -> None:
    """Flush and stop the provider setup_tracing installed (once; safe to call again)."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.force_flush(timeout_millis)
        provider.shutdown()
