"""Templates of the console: Jinja2 with autoescaping always on (every value a task carries
is shown as text, whatever it holds), and the filters the pages format values with."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import jinja2

from obsq.inspection.inspector import Rate
from obsq.task import bytes_preview

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("obsq.ops.ui", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=number, ago=ago, utc=utc, seconds=seconds, pretty=pretty,
                       path=lambda value: quote(str(value), safe=""), plain=plain)
    env.globals.update(bars=bars)
    return env


def number(value: int | float | None) -> str:
    return "" if value is None else f"{value:,}"


def plain(value: Any) -> Any:
    """3600.0 -> 3600: options read back from JSON keep the float the client sent."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def utc(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def ago(value: datetime | None) -> str:
    """'3m ago', or 'in 2h' for a time to come."""
    if value is None:
        return ""
    delta = time.time() - value.timestamp()
    text = seconds(abs(delta), whole=True)
    return f"{text} ago" if delta >= 0 else f"in {text}"


def seconds(value: float, whole: bool = False) -> str:
    if value < 60:
        return f"{value:.0f}s" if whole or value >= 10 or value == 0 else f"{value:.1f}s"
    for unit, size, smaller, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                            ("m", 60, "s", 1)):
        if value >= size:
            rest = int(value % size // small_size)
            return f"{int(value // size)}{unit}" + (f" {rest}{smaller}" if rest else "")
    return f"{value:.0f}s"


def pretty(value: Any) -> str:
    if isinstance(value, bytes):  # a bytes payload
        return bytes_preview(value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)


def bars(rates: list[Rate], height: int = 28) -> list[tuple[int, int, int]]:
    """A sparkline of the last hour: per minute (x, height of the runs, height of the
    failures), scaled to the busiest minute."""
    top = max((r.processed for r in rates), default=0) or 1
    return [(i, round(r.processed / top * height), round(r.failed / top * height))
            for i, r in enumerate(rates)]


def trace_link(template: str | None, headers: dict[str, str]) -> str | None:
    """The trace URL of a task: the template with the trace id of its traceparent."""
    match = TRACEPARENT.match(headers.get("traceparent", "")) if template else None
    if not match or not template or set(match.group(1)) == {"0"}:
        return None
    return template.replace("{trace_id}", match.group(1)).replace("{span_id}",
                                                                  match.group(2))
