"""A periodic task entry: when it is due, from a cron spec (croniter) or '@every 30s'."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson
from croniter import croniter

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_every(spec: str) -> float | None:
    """'@every 90s' -> 90.0; None when `spec` is not an interval."""
    if not spec.startswith("@every "):
        return None
    text = spec[len("@every "):].strip()
    unit = next((u for u in sorted(UNITS, key=len, reverse=True) if text.endswith(u)), None)
    try:
        seconds = float(text[: -len(unit)] if unit else text) * UNITS[unit or "s"]
    except ValueError:
        raise ValueError(f"{spec!r} is not an interval like '@every 30s'") from None
    if seconds <= 0:
        raise ValueError(f"{spec!r} must be a positive interval")
    return seconds


@dataclass(frozen=True)
class Periodic:
    spec: str
    task_type: str
    payload: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if parse_every(self.spec) is None and not croniter.is_valid(self.spec):
            raise ValueError(f"{self.spec!r} is neither a cron spec nor '@every <interval>'")
        orjson.dumps(self.payload)  # fail at registration, not at the first run

    @property
    def id(self) -> str:
        """Stable across restarts and replicas: derived from what the entry does."""
        blob = orjson.dumps([self.spec, self.task_type, self.payload, self.options],
                            option=orjson.OPT_SORT_KEYS, default=str)
        return hashlib.sha1(blob).hexdigest()[:16]

    def next_after(self, ts: float) -> float:
        every = parse_every(self.spec)
        if every is not None:
            return ts + every
        start = datetime.fromtimestamp(ts, tz=timezone.utc)
        return croniter(self.spec, start).get_next(float)
