"""Replacing a process that runs handlers before a leak in them costs a task
(`--max-tasks-per-child N`, `--max-memory-per-child MB`): a process past its limit finishes
the task it runs, then is replaced. The process pool (`--pool process`) replaces its
children so, and a worker process of `--processes N` drains and the supervisor starts
another. Memory is the process's resident set after each task, read from /proc (where there
is none, the peak resident set, which never falls, stands in for it)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

RECYCLE_REASONS = ("tasks", "memory")  # why a process was replaced (the metric's label)
MEGABYTE = 1 << 20


@dataclass(frozen=True)
class Recycling:
    """The limits of one process (0: none); small enough to travel to a child by pickle."""

    max_tasks: int = 0
    max_memory_mb: float = 0

    def __bool__(self) -> bool:
        return bool(self.max_tasks or self.max_memory_mb)

    def spent(self, tasks: int) -> str | None:
        """Why this process, having ended `tasks` tasks, is replaced now (one of
        RECYCLE_REASONS), or None while it is within its limits."""
        if self.max_tasks and tasks >= self.max_tasks:
            return "tasks"
        if self.max_memory_mb and resident_bytes() > self.max_memory_mb * MEGABYTE:
            return "memory"
        return None

    def said(self, reason: str, tasks: int) -> str:
        """The log's words for a replacement."""
        if reason == "tasks":
            return f"after {tasks} tasks (--max-tasks-per-child {self.max_tasks})"
        return (f"at {resident_bytes() / MEGABYTE:.0f} MB resident after {tasks} tasks "
                f"(--max-memory-per-child {self.max_memory_mb:g})")


def resident_bytes() -> int:
    """This process's resident set now, in bytes."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB here


NO_RECYCLING = Recycling()  # a process kept whatever it runs
