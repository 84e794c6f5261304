"""What a length of time may be. Every time obsq is given (a setting, a task option, a
deadline) becomes milliseconds on Redis's clock, kept in sorted-set scores and compared in
Lua, whose numbers hold whole milliseconds exactly only up to 2**53 (about 285,000 years
from 1970). `inf` would be a time that never comes and `nan` one that never compares; a
huge finite number (1e16 seconds) loses its precision there, so a lease of that length
expired at once and its task ran twice. So a time is a real number no longer than
LONGEST_SECONDS."""

from __future__ import annotations

import math
from typing import Any

LONGEST_SECONDS = 10 * 365 * 24 * 3600.0  # ten years: beyond anything obsq waits for
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def is_seconds(value: Any, *, zero: bool = False) -> bool:
    """Whether `value` is a number of seconds obsq can keep: above 0 (at least 0 with
    `zero`), finite and at most LONGEST_SECONDS; a bool is not a number here."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and (value >= 0 if zero else value > 0)
            and value <= LONGEST_SECONDS)


def seconds_rule(zero: bool = False) -> str:
    """How `is_seconds` is worded in an error: 'a positive number of seconds of at most ...'."""
    return (f"a {'non-negative' if zero else 'positive'} number of seconds of at most "
            f"{LONGEST_SECONDS:.0f} (ten years)")


def check_seconds(name: str, value: Any, *, zero: bool = False) -> None:
    """A time given as an option: a number of seconds obsq can keep (obsq/seconds.py),
    above 0 (or at least 0 with `zero`)."""
    if not is_seconds(value, zero=zero):
        raise ValueError(f"{name} must be {seconds_rule(zero)}, got {value!r}")


def duration(name: str, value: float | None, minimum: float = 0.001) -> float:
    """A length of time in seconds: 0 (or None) for none, else at least `minimum` (Redis
    counts expiries in whole milliseconds and refuses 0)."""
    if value is None or value == 0:
        return 0.0
    if not (is_seconds(value) and value >= minimum):
        raise ValueError(f"{name} must be 0 or a number of seconds of at least {minimum:g} "
                         f"and at most {LONGEST_SECONDS:.0f} (ten years), got {value!r}")
    return float(value)


def parse_rate(rate: str) -> float:
    """'100/s' (or '/m', '/h') -> starts per second."""
    count, _, unit = str(rate).partition("/")
    try:
        per_second = float(count) / RATE_UNITS[unit.strip()]
    except (ValueError, KeyError):
        raise ValueError(f"rate_limit {rate!r} is not like '100/s', '30/m' or '5/h'") from None
    if not (per_second > 0 and math.isfinite(per_second)):
        raise ValueError(f"rate_limit {rate!r} must be a positive rate")
    return per_second
