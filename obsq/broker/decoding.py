"""What Redis replies, read as Python values alike in every broker module: text (bytes
that are not UTF-8 kept readable), a count, and a number that may be absent. A field
written by hand that is not a number reads as nothing (0, or None), never as a crash."""

from __future__ import annotations


def as_text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def as_count(raw: bytes | None) -> int:
    """A stored count or time; 0 when absent or not a number."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def as_number(raw: bytes | str | int | None) -> int | None:
    """A stored number, None when absent or not a number; a score comes back as
    '1.7e12'-style text."""
    if raw in (None, b"", ""):
        return None
    try:
        return int(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
