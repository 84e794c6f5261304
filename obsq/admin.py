"""The operator's commands, on obsq.Inspector: `obsq stats|queues|tasks|task|workers|
schedules` to look (each with --json for scripts), `obsq requeue|delete|purge|pause|
unpause` to repair, and `obsq ui`, the web console. Tables are aligned for people and
coloured only on a terminal (never with NO_COLOR); an unknown queue or task is one line on
stderr, exit 1."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from obsq.broker import DEPTH_STATES, TASK_STATES
from obsq.broker.inspection import PURGEABLE, REVIVABLE
from obsq.errors import ConfigurationError, QueueNotFound, TaskNotFound, TaskRunning
from obsq.inspector import Inspector, QueueInfo, ScheduleInfo, TaskDetail, WorkerInfo, as_data
from obsq.task import bytes_preview

Command = Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser]
COLOURS = {"dead": "31", "retry": "33", "active": "36", "completed": "32", "paused": "33",
           "error": "31", "dim": "2", "bold": "1"}


def add_commands(command: Command, handler: Callable[[argparse.Namespace], int]) -> None:
    """Register the operator's subcommands on the `obsq` parser; `command(name, help,
    handler)` adds one with the shared --redis-url and --namespace options."""
    def looking(name: str, help: str) -> argparse.ArgumentParser:
        sub = command(name, help, handler)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    looking("stats", "queues, their depth by state, and live workers")
    looking("queues", "every queue: depth by state, latency, throughput and failures")
    tasks = looking("tasks", "list the tasks of a queue in one state, a page at a time")
    tasks.add_argument("queue")
    tasks.add_argument("state", choices=TASK_STATES)
    tasks.add_argument("--limit", type=int, default=20)
    tasks.add_argument("--offset", type=int, default=0)
    tasks.add_argument("--type", help="only this task type (or prefix ending in : or .)")
    task = looking("task", "everything about one task: payload, error, traceback, worker")
    task.add_argument("id")
    task.add_argument("--queue", help="its queue (default: looked up)")
    looking("workers", "live workers: host, pid, queues, busy slots, last heartbeat")
    looking("schedules", "schedule entries: spec, timezone, missed policy, next and last fire")
    requeue = command("requeue", "put dead (or retry/scheduled) tasks back to pending now",
                      handler)
    requeue.add_argument("queue")
    requeue.add_argument("ids", nargs="*", help="task ids (default: all in the state)")
    requeue.add_argument("--state", default="dead", choices=REVIVABLE)
    cancel = command("cancel", "cancel a task: it never runs, or its worker stops it", handler)
    cancel.add_argument("id")
    cancel.add_argument("--queue", help="its queue (default: looked up)")
    delete = command("delete", "delete a task that is not running", handler)
    delete.add_argument("id")
    delete.add_argument("--queue", help="its queue (default: looked up)")
    purge = command("purge", "delete every task of a queue in one state", handler)
    purge.add_argument("queue")
    purge.add_argument("state", choices=PURGEABLE)
    purge.add_argument("--yes", action="store_true", help="do not ask on a terminal")
    for name, help in (("pause", "stop workers taking tasks from a queue"),
                       ("unpause", "let workers take tasks from a queue again")):
        command(name, help, handler).add_argument("queue")
    ui = command("ui", "the web console (needs the ui extra: pip install 'obsq[ui]')", handler)
    ui.add_argument("--host", help="address to bind (OBSQ_UI_HOST, 127.0.0.1)")
    ui.add_argument("--port", type=int, help="OBSQ_UI_PORT, 8181")
    ui.add_argument("--token", help="allows actions (OBSQ_UI_TOKEN); without it the console "
                    "is read-only")
    ui.add_argument("--read-only", action="store_const", const=True,
                    help="no actions even with a token (OBSQ_UI_READ_ONLY)")
    ui.add_argument("--trace-url", help="link to a task's trace, with {trace_id} "
                    "(OBSQ_UI_TRACE_URL)")


async def run(command: str, redis_url: str, namespace: str, args: argparse.Namespace) -> int:
    inspector = Inspector(redis_url, namespace)
    try:
        await inspector.check()
        if command == "ui":
            try:
                from obsq.ui.server import serve_from_args
            except ImportError as exc:
                raise ConfigurationError(f"the console needs the ui extra (pip install "
                                         f"'obsq[ui]'): {exc}") from None
            await serve_from_args(inspector, args)
            return 0
        out = Output(getattr(args, "json", False))
        await HANDLERS[command](inspector, args, out)
        return out.status
    except ConfigurationError:
        raise
    except (QueueNotFound, TaskNotFound, TaskRunning, ValueError) as exc:
        hint = await _hint(inspector) if isinstance(exc, QueueNotFound) else ""
        print(f"obsq {command}: {exc}{hint}", file=sys.stderr)
        return 1
    finally:
        await inspector.close()


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


async def stats(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    queues, workers = await inspector.queues(), await inspector.workers()
    if out.as_json:
        return out.data({"queues": queues, "workers": workers})
    rows = [[q.name, *(_count(q.depth[s], s) for s in DEPTH_STATES), f"{q.latency:.1f}s",
             ("yes", "paused") if q.paused else ""] for q in queues]
    print(out.table(["queue", *DEPTH_STATES, "latency", "paused"], rows) if rows
          else await _empty(inspector))
    print(f"\n{len(workers)} live worker(s)")
    if workers:
        print(_workers_table(out, workers))


async def queues(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    found = await inspector.queues()
    if out.as_json:
        return out.data(found)
    if not found:
        print(await _empty(inspector))
        return
    print(out.table(
        ["queue", *DEPTH_STATES, "latency", "paused", "done/min", "failed/min", "done/h",
         "failed/h"],
        [[q.name, *(_count(q.depth[s], s) for s in DEPTH_STATES), f"{q.latency:.1f}s",
          ("yes", "paused") if q.paused else "", *_rate_cells(q)] for q in found]))


async def tasks(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    page = await inspector.tasks(args.queue, args.state, args.limit, args.offset, args.type)
    if out.as_json:
        return out.data(page)
    if not page.tasks:
        kind = f" of type {args.type}" if args.type else ""
        print(f"no {args.state} tasks{kind} in {args.queue}" +
              (f" at offset {args.offset}" if args.offset else ""))
        return
    print(out.table(["id", "type", "retries", "time (UTC)", "error"], [
        [t.id, t.type, str(t.retry_count), _when(t.due_at if args.state in (
            "scheduled", "retry") else t.finished_at or t.enqueued_at),
         (t.error.splitlines()[0][:80] if t.error else "", "error")] for t in page.tasks]))
    more = f"; next page: --offset {page.next_offset}" if page.next_offset is not None else ""
    print(out.paint(f"\n{len(page.tasks)} shown, {page.total:,} {args.state} in "
                    f"{args.queue}{more}", "dim"))


async def task(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    detail = await inspector.task(args.id, args.queue)
    if out.as_json:
        return out.data(detail)
    print(_task_text(out, detail))


async def workers(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    found = await inspector.workers()
    if out.as_json:
        return out.data(found)
    print(_workers_table(out, found) if found else "no live workers")


async def schedules(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    found = await inspector.schedules()
    if out.as_json:
        return out.data(found)
    if not found:
        print(f"no schedules in namespace {inspector.namespace!r} (those of an App's code "
              "appear once its scheduler runs)")
        return
    print(_schedules_table(out, found))
    for s in found:
        if s.error:
            print(out.paint(f"{s.error}; the scheduler skips it", "error"), file=sys.stderr)


async def requeue(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    done = await inspector.requeue(args.queue, args.state, args.ids or None)
    if done.missing:
        moved = f" (the other {done.moved} moved to pending)" if done.moved else ""
        out.fail(f"obsq requeue: not in {args.state} of {args.queue}: "
                 f"{', '.join(done.missing)}{moved}")
        return
    line = f"moved {done.moved} task(s) from {args.state} to pending in {args.queue}"
    if not args.ids and done.left:
        line += f"; {done.left} arrived in {args.state} meanwhile and are still there"
    print(line)


async def cancel(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    state = await inspector.cancel(args.id, args.queue)
    print({"cancelled": f"cancelled task {args.id}",
           "running": f"task {args.id} is running: its worker is stopping it"}.get(
               state, f"task {args.id} had ended already ({state})"))


async def delete(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    state = await inspector.delete(args.id, args.queue)
    print(f"deleted task {args.id} (it was {state})")


async def purge(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    depth = (await inspector.queue(args.queue)).depth[args.state]
    if depth and not args.yes and sys.stdin.isatty():
        answer = input(f"delete {depth} {args.state} task(s) of {args.queue}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return
    deleted = await inspector.purge(args.queue, args.state)
    print(f"deleted {deleted} {args.state} task(s) of {args.queue}")


async def pause(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    await (inspector.pause if args.command == "pause" else inspector.unpause)(args.queue)
    print(f"queue {args.queue} {args.command}d")


HANDLERS = {"stats": stats, "queues": queues, "tasks": tasks, "task": task,
            "workers": workers, "schedules": schedules, "requeue": requeue, "cancel": cancel,
            "delete": delete, "purge": purge, "pause": pause, "unpause": pause}


async def _empty(inspector: Inspector) -> str:
    return f"no queues in namespace {inspector.namespace!r}{await _hint(inspector)}"


async def _hint(inspector: Inspector) -> str:
    """Where to look instead: the namespace's queues, else the namespaces that exist."""
    names = await inspector.queue_names()
    if names:
        return f" (its queues: {', '.join(names)})"
    others = [n for n in await inspector.namespaces() if n != inspector.namespace]
    if others:
        return f"; namespaces with queues here: {', '.join(others[:20])} (--namespace NS)"
    return ""


def _count(n: int, state: str) -> tuple[str, str | None]:
    return str(n), state if n and state in ("dead", "retry") else None


def _rate_cells(q: QueueInfo) -> list[Any]:
    return [str(q.last_minute.processed), (str(q.last_minute.failed),
                                           "error" if q.last_minute.failed else None),
            str(q.last_hour.processed), (str(q.last_hour.failed),
                                         "error" if q.last_hour.failed else None)]


def _workers_table(out: Output, found: list[WorkerInfo]) -> str:
    now = time.time()
    return out.table(["worker", "host", "pid", "queues", "busy", "processed", "up",
                      "heartbeat", "version"], [
        [w.id, w.host, str(w.pid), ",".join(w.queues), f"{w.busy}/{w.concurrency}",
         str(w.processed), _age(now, w.started_at), _age(now, w.last_heartbeat) + " ago",
         w.version + (" (draining)" if w.draining else "")] for w in found])


def _schedules_table(out: Output, found: list[ScheduleInfo]) -> str:
    return out.table(["schedule", "spec", "timezone", "task", "if-missed", "next (UTC)",
                      "last (UTC)", "fired", "missed", "from"], [
        [s.name, s.spec, s.timezone, s.type, s.missed,
         _when(s.next_fire_at) if not s.error else ("not valid", "error"),
         _when(s.last_fire_at), str(s.fire_count),
         (str(s.missed_count), "retry" if s.missed_count else None), s.source]
        for s in found])


def _task_text(out: Output, d: TaskDetail) -> str:
    max_retry = "the route's default" if d.max_retry is None else d.max_retry
    fields = [("id", d.id), ("queue", d.queue), ("type", d.type),
              ("state", out.paint(d.state, d.state)),
              ("retries", f"{d.retry_count} of {max_retry}"),
              ("enqueued", _when(d.enqueued_at)), ("due", _when(d.due_at)),
              ("finished", _when(d.completed_at)), ("worker", d.worker or ""),
              ("lease until", _when(d.lease_expires_at)), ("recoveries", str(d.recoveries)),
              ("unique", d.unique_key or ""), ("headers", _json(d.headers) if d.headers else ""),
              ("options", _json(d.options) if d.options else ""),
              ("error", out.paint(d.error or "", "error")),
              ("progress", _json(d.progress) if d.progress is not None else ""),
              ("result", _json(d.result) if d.result is not None else "")]
    lines = [f"{out.paint(name.ljust(12), 'bold')}{value}" for name, value in fields]
    payload = bytes_preview(d.payload) if isinstance(d.payload, bytes) else json.dumps(
        d.payload, indent=2, ensure_ascii=False)
    lines += [out.paint("payload", "bold"), _indent(payload)]
    if d.traceback:
        lines += [out.paint("traceback", "bold"), _indent(d.traceback.rstrip())]
    return "\n".join(lines)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _age(now: float, value: datetime | None) -> str:
    if value is None:
        return "-"
    seconds = max(now - value.timestamp(), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
