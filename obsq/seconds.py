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
