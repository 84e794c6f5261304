"""Per-task priority within a queue: an integer 0 to 9, higher first, 0 by default. A task
of priority p waits in its queue's list for p (`pending` for 0, `pending:<p>` else), and a
worker's fetch serves the best ranked head first, a task pending for w seconds ranking as
p + w / aging (WorkerSettings.priority_aging, 60 s): a low priority ages into the higher
ones instead of waiting for good (docs/internals/fetching.md)."""

from __future__ import annotations

from typing import Any

PRIORITIES = range(10)


def check_priority(value: Any) -> int:
    """`value` as a priority, or ValueError/TypeError saying what one is (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an integer from 0 to 9 (higher runs first), got "
                        f"{value!r}")
    if value not in PRIORITIES:
        raise ValueError(f"priority must be from 0 to 9 (higher runs first), got {value!r}")
    return value
