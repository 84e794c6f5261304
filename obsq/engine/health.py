"""How a worker is, as its probes judge it. Liveness judges the process alone: its event
loop runs (or has not been blocked longer than the configured limit) and its heartbeat
thread comes round; a restart would fix what it fails on. Redis belongs to readiness: a
Redis outage restarting every worker at once would only add a restart storm to it.

Each check is one small function of WorkerHealth returning the reason it fails, or None;
add a condition by adding a function to LIVENESS or READINESS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerHealth:
    """What the liveness and readiness probes judge by (read from any thread)."""

    started: bool
    draining: bool
    heartbeat_age: float = 0.0  # seconds since Redis last accepted a heartbeat
    redis_ok: bool = True  # the heartbeat's last call succeeded
    redis_answers: bool = True  # a heartbeat was answered within two intervals (False
    #                             while Redis hangs: no error, no answer either)
    loop_lag: float = 0.0  # how long the event loop has been blocked now (0: it runs)
    loop_limit: float = 60.0  # liveness fails once loop_lag passes this
    heartbeat_stalled: float = 0.0  # seconds the heartbeat thread has not come round
    #                                 (inf: it died); a Redis call under way is not counted
    # Plain handlers that overran their timeout and still hold their slots, how
    # long the longest-stuck of them has been stuck (obsq/engine/pools), and the limits
    stuck_slots: int = 0
    stuck_seconds: float = 0.0
    stuck_limit: float = 300.0  # liveness fails once a slot has been stuck this long
    slots: int = 1  # readiness fails once this many are stuck


Check = Callable[[WorkerHealth], "str | None"]


def loop_blocked(h: WorkerHealth) -> str | None:
    if h.loop_lag > h.loop_limit:
        return (f"the event loop has been blocked for {h.loop_lag:.0f} s (limit "
                f"{h.loop_limit:g} s)")
    return None


def heartbeat_thread_stuck(h: WorkerHealth) -> str | None:
    if h.heartbeat_stalled == float("inf"):
        return "the heartbeat thread has died"
    if h.heartbeat_stalled > h.loop_limit:
        return f"the heartbeat thread has not come round for {h.heartbeat_stalled:.0f} s"
    return None


def stuck_too_long(h: WorkerHealth) -> str | None:
    """A handler stuck past the limit will not return; only a restart frees it."""
    if h.stuck_slots and h.stuck_seconds > h.stuck_limit:
        return (f"{h.stuck_slots} slot(s) stuck in plain handlers that overran their "
                f"timeout, the longest for {h.stuck_seconds:.0f} s (limit {h.stuck_limit:g} s)")
    return None


def every_slot_stuck(h: WorkerHealth) -> str | None:
    """As many hung handlers as slots is a worker in trouble."""
    if h.stuck_slots >= h.slots:
        return f"every slot is stuck ({h.stuck_slots} plain handlers overran their timeout)"
    return None


def not_serving(h: WorkerHealth) -> str | None:
    if h.draining:
        return "the worker is draining"
    if not h.started:
        return "the worker is starting"
    return None


def redis_away(h: WorkerHealth) -> str | None:
    if not h.redis_ok:
        return "Redis is unreachable"
    if not h.redis_answers:
        return f"Redis has not answered for {h.heartbeat_age:.0f} s"
    return None


LIVENESS: list[Check] = [loop_blocked, heartbeat_thread_stuck, stuck_too_long]
READINESS: list[Check] = [not_serving, redis_away, every_slot_stuck]


def first_problem(health: WorkerHealth, checks: list[Check]) -> str | None:
    """The reason of the first check that fails, or None."""
    for check in checks:
        problem = check(health)
        if problem is not None:
            return problem
    return None
