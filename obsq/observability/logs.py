"""Log records as text or JSON lines, each with the trace and span ids of the span that was
current when it was written, so a log line leads to its trace and back."""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import orjson
from opentelemetry import trace

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span, in the W3C hex form, or None."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class TraceContextFilter(logging.Filter):
    """Adds `trace_id` and `span_id` (empty strings without a span) to each record. Attached
    to the handler, it runs in the thread and context that logged the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id"):
            ids = current_ids()
            record.trace_id, record.span_id = ids if ids else ("", "")
        return True


def _trace_ids(record: logging.LogRecord) -> tuple[str, str]:
    """(trace_id, span_id) TraceContextFilter set on `record`, empty strings otherwise: they
    are attributes it adds, which LogRecord does not declare."""
    return getattr(record, "trace_id", ""), getattr(record, "span_id", "")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace_id, span_id = _trace_ids(record)
        if not trace_id:
            return text
        first, newline, rest = text.partition("\n")  # keep a traceback below the ids
        return f"{first} trace_id={trace_id} span_id={span_id}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, exc_info,
    trace_id/span_id when a span is current, and any `extra` values that serialize."""

    _standard = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime",
                                                                  "trace_id", "span_id"}

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        trace_id, span_id = _trace_ids(record)
        if trace_id:
            entry["trace_id"] = trace_id
            entry["span_id"] = span_id
        for key, value in record.__dict__.items():
            if key not in self._standard and not key.startswith("_"):
                entry[key] = value
        return orjson.dumps(entry, default=str).decode()


def configure_logging(fmt: str = "text", level: str | int = "INFO",
                      stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger's records to `stream` (stderr) as `text` or `json` lines.

    Calling it again replaces the handler it added before; other handlers stay."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name("obsq")
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "obsq":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
