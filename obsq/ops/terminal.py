"""How the `obsq` commands write: JSON for scripts, or aligned tables and blocks of text for
people, coloured only on a terminal (never with NO_COLOR or TERM=dumb)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from typing import Any

from obsq.broker import DEPTH_STATES
from obsq.flow import FlowInfo
from obsq.inspection.inspector import (
    GroupPage,
    PartitionInfo,
    QueueInfo,
    ScheduleInfo,
    TaskDetail,
    TaskPage,
    WorkerInfo,
    as_data,
)
from obsq.settings import DEFAULT_MAX_RETRY
from obsq.task import bytes_preview

COLOURS = {"dead": "31", "retry": "33", "active": "36", "completed": "32", "paused": "33",
           "error": "31", "dim": "2", "bold": "1"}


class Output:
    """Where a command writes: JSON, or text coloured when stdout is a terminal."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and \
            os.environ.get("TERM") != "dumb"
        self.status = 0

    def data(self, value: Any) -> None:
        print(json.dumps(as_data(value), indent=2, ensure_ascii=False))

    def paint(self, text: str, style: str | None) -> str:
        code = COLOURS.get(style or "")
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code and text else text

    def table(self, header: list[str], rows: list[list[Any]]) -> str:
        """Aligned columns; a cell is text or (text, style)."""
        cells = [[c if isinstance(c, tuple) else (str(c), None) for c in row]
                 for row in rows]
        widths = [max(len(c[0]) for c in column)
                  for column in zip([(h, None) for h in header], *cells)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
        for row in cells:
            lines.append("  ".join(self.paint(t.ljust(w), s) for (t, s), w
                                   in zip(row, widths)).rstrip())
        return "\n".join(lines)

    def fail(self, message: str) -> None:
        print(message, file=sys.stderr)
        self.status = 1


def print_tasks(out: Output, page: TaskPage, where: str) -> None:
    """No error column for completed tasks: an error there is an earlier attempt's; a
    partition column for a partitioned queue's, whose pages go through its partitions one
    after another (a state's order holds within each, not across them)."""
    errors = page.state != "completed"
    partitioned = any(t.partition for t in page.tasks)
    print(out.table(["id", "type", *(["partition"] if partitioned else []), "priority",
                     "retries", "time (UTC)", *(["error"] if errors else [])], [
        [t.id, t.type, *([t.partition] if partitioned else []), str(t.priority),
         str(t.retry_count), when(t.due_at if page.state in (
             "scheduled", "retry") else t.finished_at or t.enqueued_at),
         *([(first_line(t.error), "error")] if errors else [])] for t in page.tasks]))
    across = any(t.partition not in ("", page.queue) for t in page.tasks)  # not one named
    order = "; tasks are listed partition by partition" if across else ""
    more = f"; next page: --offset {page.next_offset}" if page.next_offset is not None else ""
    print(out.paint(f"\n{len(page.tasks)} shown, {page.total:,} {where}{order}{more}", "dim"))


def queues_table(out: Output, found: list[QueueInfo], detailed: bool = False) -> str:
    """A row a queue (a partitioned one summed); `detailed`: with its partitions and its
    runs and failures."""
    return out.table(
        ["queue", *(["partitions"] if detailed else []), *DEPTH_STATES, "latency", "paused",
         *(RATE_COLUMNS if detailed else [])],
        [[q.name, *([str(q.partition_count or "-")] if detailed else []),
          *_depth_cells(q.depth), f"{q.latency:.1f}s", _paused(q),
          *(_rate_cells(q) if detailed else [])] for q in found])


def partitions_table(out: Output, q: QueueInfo) -> str:
    """A line with the queue's partition count, then its partitions, a row each, indented;
    one of an earlier count (draining) says so after its name."""
    earlier = sum(p.earlier for p in q.partitions)
    also = f", and {earlier} of an earlier count still holding tasks" if earlier else ""
    table = out.table(
        ["partition", "index", *DEPTH_STATES, "latency", "paused", *RATE_COLUMNS],
        [[(f"{p.name} (earlier count, draining)", "dim") if p.earlier else p.name,
          f"{p.index}/{p.count}", *_depth_cells(p.depth), f"{p.latency:.1f}s",
          ("yes", "paused") if p.paused else "", *_rate_cells(p)] for p in q.partitions])
    return f"{q.name}: {q.partition_count} partitions{also}\n{indent(table)}"


def fairness_keys_table(out: Output, q: QueueInfo) -> str:
    """A line with the count of the queue's fairness keys with waiting tasks, then those
    with most, a row each, indented."""
    table = out.table(["fairness key", "waiting"],
                      [[key, str(waiting)] for key, waiting in q.top_keys])
    return (f"{q.name}: {q.keys_waiting:,} fairness keys with waiting tasks; the "
            f"{len(q.top_keys)} with most:\n{indent(table)}")


RATE_COLUMNS = ["runs/min", "failed/min", "runs/h", "failed/h"]


def _depth_cells(depth: dict[str, int]) -> list[tuple[str, str | None]]:
    return [(str(depth[s]), s if depth[s] and s in ("dead", "retry") else None)
            for s in DEPTH_STATES]


def _paused(q: QueueInfo) -> Any:
    """'yes' when the queue is paused; of a partitioned one of which only some partitions
    are, how many."""
    paused = sum(p.paused for p in q.partitions)
    if not q.paused and paused:
        return f"{paused}/{len(q.partitions)}", "paused"
    return ("yes", "paused") if q.paused else ""


def _rate_cells(q: QueueInfo | PartitionInfo) -> list[Any]:
    return [str(q.last_minute.processed), (str(q.last_minute.failed),
                                           "error" if q.last_minute.failed else None),
            str(q.last_hour.processed), (str(q.last_hour.failed),
                                         "error" if q.last_hour.failed else None)]


def groups_table(out: Output, page: GroupPage, with_due: bool) -> str:
    """Groups with their ages; the due time only when the App was given (--app)."""
    return out.table(["type", "group", "size", "oldest", "idle",
                      *(["due (UTC)"] if with_due else [])], [
        [g.type, g.group, str(g.size), duration(g.age), duration(g.idle),
         *([when(g.due_at) or "no aggregator"] if with_due else [])] for g in page.groups])


def first_line(text: str) -> str:
    return text.splitlines()[0][:80] if text else ""


def workers_table(out: Output, found: list[WorkerInfo]) -> str:
    now = time.time()
    return out.table(["worker", "host", "pid", "queues", "busy", "processed", "up",
                      "heartbeat", "version"], [
        [w.id, w.host, str(w.pid), ",".join(w.queues), f"{w.busy}/{w.concurrency}",
         str(w.processed), age(now, w.started_at), age(now, w.last_heartbeat) + " ago",
         w.version + (" (draining)" if w.draining else "")] for w in found])


def schedules_table(out: Output, found: list[ScheduleInfo]) -> str:
    return out.table(["schedule", "spec", "timezone", "task", "if-missed", "next (UTC)",
                      "last (UTC)", "fired", "missed", "from"], [
        [s.name, s.spec, s.timezone, s.type, s.missed,
         when(s.next_fire_at) if not s.error else ("not valid", "error"),
         when(s.last_fire_at), str(s.fire_count),
         (str(s.missed_count), "retry" if s.missed_count else None), s.source]
        for s in found])


def task_text(out: Output, d: TaskDetail) -> str:
    """A completed task's error and traceback are its last failed attempt's, said as such."""
    max_retry = (f"{DEFAULT_MAX_RETRY} (the default, unless its route sets max_retry)"
                 if d.max_retry is None else d.max_retry)
    earlier = " (of the last failed attempt; retried, then completed)" if (
        d.state == "completed" and d.error) else ""
    fields = [("id", d.id), ("queue", d.queue),
              *([("partition", d.partition)] if d.partition else []), ("type", d.type),
              ("state", out.paint(d.state, d.state)), ("priority", str(d.priority)),
              ("retries", f"{d.retry_count} of {max_retry}"),
              ("enqueued", when(d.enqueued_at)), ("due", when(d.due_at)),
              ("finished", when(d.completed_at)),
              ("worker", d.worker or "none running it"),
              ("lease until", when(d.lease_expires_at)), ("recoveries", str(d.recoveries)),
              ("unique", d.unique_key or ""),
              ("debounce", d.debounce_key or ""),
              ("headers", json_text(d.headers) if d.headers else ""),
              ("options", json_text(d.options) if d.options else ""),
              ("error", out.paint(d.error or "", "error") + (earlier if d.error else "")),
              ("progress", json_text(d.progress) if d.progress is not None else ""),
              ("result", json_text(d.result) if d.result is not None else "")]
    lines = [f"{out.paint(name.ljust(12), 'bold')}{value}" for name, value in fields]
    payload = bytes_preview(d.payload) if isinstance(d.payload, bytes) else json.dumps(
        d.payload, indent=2, ensure_ascii=False)
    lines += [out.paint("payload", "bold"), indent(payload)]
    if d.traceback:
        lines += [out.paint("traceback" + earlier, "bold"), indent(d.traceback.rstrip())]
    return "\n".join(lines)


def flow_text(out: Output, f: FlowInfo) -> str:
    """A flow's state, then a table of its steps (the step that ended it marked)."""
    fields = [("flow", f.id), ("state", out.paint(f.state, _FLOW_STYLE.get(f.state, f.state))),
              ("enqueued", when(f.enqueued_at)), ("finished", when(f.completed_at)),
              ("failed at", "" if f.failed_step is None else f"step {f.failed_step}"),
              ("error", out.paint(first_line(f.error or ""), "error")),
              ("result", json_text(f.result) if f.result is not None else "")]
    lines = [f"{out.paint(name.ljust(12), 'bold')}{value}" for name, value in fields]
    rows = [[str(s.index), s.id, s.queue, s.type, (s.state, _FLOW_STYLE.get(s.state, s.state)),
             " ".join(map(str, s.waits_for)) or "-"] for s in f.steps]
    return "\n".join([*lines, "", out.table(["step", "task", "queue", "type", "state",
                                             "waits for"], rows)])


def flows_table(out: Output, found: list[FlowInfo]) -> str:
    rows = []
    for f in found:
        rows.append([f.id, (f.state, _FLOW_STYLE.get(f.state, f.state)),
                     f"{f.steps_completed}/{f.step_count}", when(f.enqueued_at),
                     when(f.completed_at),
                     ("" if f.failed_step is None else f"step {f.failed_step}", "error")])
    return out.table(["flow", "state", "steps done", "enqueued (UTC)", "finished (UTC)",
                      "failed at"], rows)


_FLOW_STYLE = {"running": "active", "failed": "dead"}


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def age(now: float, value: datetime | None) -> str:
    return "-" if value is None else duration(max(now - value.timestamp(), 0))


def duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
