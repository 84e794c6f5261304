"""The operator's commands, on obsq.Inspector: `obsq stats|queues|tasks|task|groups|
workers|schedules` to look (each with --json for scripts), `obsq requeue|delete|purge|pause|
unpause` to repair, and `obsq ui`, the web console. They write through obsq/ops/terminal.py;
an unknown queue or task is one line on stderr, exit 1."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from obsq.app import load_app
from obsq.broker import TASK_STATES
from obsq.broker.inspection import PURGEABLE, REVIVABLE
from obsq.errors import (
    ConfigurationError,
    QueueNotFound,
    StartupError,
    TaskNotFound,
    TaskRunning,
)
from obsq.inspection.inspector import MAX_PAGE, Inspector
from obsq.inspection.partition_view import partitions_of
from obsq.ops.doctor import Doctor, stalls
from obsq.ops.terminal import (
    Output,
    fairness_keys_table,
    first_line,
    flow_text,
    flows_table,
    groups_table,
    partitions_table,
    print_tasks,
    queues_table,
    schedules_table,
    task_text,
    when,
    workers_table,
)

Command = Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser]



def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`); else a usage error (exit 2)
    before anything is read."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number from {low}" + (f" to {high}" if high else ""))
        return value
    return parse

def add_commands(command: Command, handler: Callable[[argparse.Namespace], int]) -> None:
    """Register the operator's subcommands on the `obsq` parser; `command(name, help,
    handler)` adds one with the shared --redis-url and --namespace options."""
    def looking(name: str, help: str) -> argparse.ArgumentParser:
        sub = command(name, help, handler)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    looking("stats", "queues, their depth by state, and live workers")
    queues = looking("queues", "every queue: depth by state, latency, throughput and "
                     "failures; a partitioned queue as one, its partitions when named")
    queues.add_argument("names", nargs="*", metavar="queue", help="these queues only, "
                        "each partitioned one with a row for each partition")
    tasks = looking("tasks", "list the tasks of a queue in one state, a page at a time")
    tasks.add_argument("queue")
    tasks.add_argument("state", choices=TASK_STATES)
    tasks.add_argument("--limit", type=whole(1, MAX_PAGE), default=20,
                       help=f"tasks a page (1 to {MAX_PAGE}; 20)")
    tasks.add_argument("--offset", type=whole(0), default=0)
    tasks.add_argument("--type", help="only this task type (or prefix ending in : or .)")
    task = looking("task", "everything about one task: payload, error, "
                   "traceback, the worker running it")
    task.add_argument("id")
    task.add_argument("--queue", help="its queue (default: looked up)")
    flow = looking("flow", "a flow (chain or chord): its steps and where it stands")
    flow.add_argument("id")
    flows = looking("flows", "the flows kept: running, or ended within their retention")
    flows.add_argument("--limit", type=whole(1, MAX_PAGE), default=20,
                       help=f"flows a page (1 to {MAX_PAGE}; 20)")
    flows.add_argument("--offset", type=whole(0), default=0)
    groups = looking("groups", "task groups waiting for their aggregator, and batches "
                     "claimed or failing; with --type and --group, one group's tasks")
    groups.add_argument("queue")
    groups.add_argument("--limit", type=whole(1, MAX_PAGE), default=20,
                       help=f"tasks a page (1 to {MAX_PAGE}; 20)")
    groups.add_argument("--offset", type=whole(0), default=0)
    groups.add_argument("--type", help="with --group: list the tasks of this group")
    groups.add_argument("--group")
    groups.add_argument("--app", metavar="MODULE:APP",
                        help="the App, to show when each group is due by its aggregator")
    doctor = looking("doctor", "check the namespace's invariants (counters, ids with no task, "
                     "records that cannot be read, orphaned attempts, flows that cannot move "
                     "on, workers whose loops stand still); exit 1 naming each problem. Work "
                     "that waits while they hold (a queue no worker serves, types no worker "
                     "handles), what was set aside as junk, and OTEL_* variables here that ask "
                     "to export spans with no exporter installed are notices, exit 0")
    doctor.add_argument("--repair", action="store_true", help="mend what can be mended "
                        "safely (set aside what cannot be read), say what was done, and "
                        "check again")
    doctor.add_argument("--strict", action="store_true", help="exit 1 on a notice too")
    looking("workers", "live workers: host, pid, queues, busy slots, last heartbeat")
    looking("schedules", "schedule entries: spec, timezone, missed policy, next and last fire")
    requeue = command("requeue", "put dead (or retry/scheduled) tasks back to pending now",
                      handler)
    requeue.add_argument("queue")
    requeue.add_argument("ids", nargs="*", help="task ids (default: all in the state)")
    requeue.add_argument("--state", default="dead", choices=REVIVABLE)
    cancel = command("cancel", "cancel a task: it never runs, or its worker stops it", handler)
    delete = command("delete", "delete a task that is not running", handler)
    for sub, what in ((cancel, "cancel the flow and its steps"),
                      (delete, "delete the ended flow and its steps' tasks")):
        sub.add_argument("id")
        sub.add_argument("--queue", help="its queue (default: looked up)")
        sub.add_argument("--flow", action="store_true", help=f"ID is a flow's: {what} "
                         "(without it: when no task has ID and a flow has)")
    purge = command("purge", "delete every task of a queue in one state", handler)
    purge.add_argument("queue")
    purge.add_argument("state", choices=PURGEABLE)
    purge.add_argument("--yes", action="store_true", help="do not ask (needed where there "
                       "is no terminal to ask, as in a script)")
    for name, help in (("pause", "stop workers taking tasks from a queue"),
                       ("unpause", "let workers take tasks from a queue again")):
        command(name, help, handler).add_argument("queue")
    ui = command("ui", "the web console (needs the ui extra: pip install 'obsq[ui]')", handler)
    ui.add_argument("--host", help="address to bind (OBSQ_UI_HOST, 127.0.0.1)")
    ui.add_argument("--http-port", type=int, help="OBSQ_UI_PORT, 8181; 0: any free port")
    ui.add_argument("--port", type=int, dest="http_port", action=_DeprecatedPort,
                    help=argparse.SUPPRESS)
    ui.add_argument("--token", help="allows actions (OBSQ_UI_TOKEN); without it the console "
                    "is read-only")
    ui.add_argument("--read-only", action="store_const", const=True,
                    help="no actions even with a token (OBSQ_UI_READ_ONLY)")
    ui.add_argument("--trace-url", help="link to a task's trace, with {trace_id} "
                    "(OBSQ_UI_TRACE_URL)")


class _DeprecatedPort(argparse.Action):
    """`obsq ui --port`, the console's flag before every command named it --http-port."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print("obsq ui: --port is deprecated, use --http-port", file=sys.stderr)
        setattr(namespace, self.dest, values)


async def run(command: str, redis_url: str, namespace: str, args: argparse.Namespace) -> int:
    inspector = Inspector(redis_url, namespace)
    try:
        await inspector.check()
        if command == "ui":
            try:
                from obsq.ops.ui.server import serve_from_args
            except ImportError as exc:
                raise StartupError(f"the console needs the ui extra (pip install "
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


async def stats(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    queues, workers = await inspector.queues(), await inspector.workers()
    if out.as_json:
        return out.data({"queues": queues, "workers": workers})
    print(queues_table(out, queues) if queues else await _empty(inspector))
    print(f"\n{len(workers)} live worker(s)")
    if workers:
        print(workers_table(out, workers))


async def queues(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    """Every queue, or those named with each partitioned one's partitions below it."""
    found = [await inspector.queue(name) for name in args.names] if args.names \
        else await inspector.queues()
    if out.as_json:
        return out.data(found)
    if not found:
        print(await _empty(inspector))
        return
    print(queues_table(out, found, detailed=True))
    for q in found if args.names else ():
        if q.partitions:
            print(f"\n{partitions_table(out, q)}")
        if q.keys_waiting:
            print(f"\n{fairness_keys_table(out, q)}")


async def tasks(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    page = await inspector.tasks(args.queue, args.state, args.limit, args.offset, args.type)
    if out.as_json:
        return out.data(page)
    if not page.tasks:
        kind = f" of type {args.type}" if args.type else ""
        print(f"no {args.state} tasks{kind} in {args.queue}" +
              (f" at offset {args.offset}" if args.offset else ""))
        return
    print_tasks(out, page, f"{args.state} in {args.queue}")


async def groups(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    if args.group or args.type:
        if not (args.group and args.type):
            raise ValueError("--type and --group go together: they name one group")
        page = await inspector.group_tasks(args.queue, args.type, args.group, args.limit,
                                           args.offset)
        if out.as_json:
            return out.data(page)
        if page.tasks:
            return print_tasks(out, page, f"in group {args.group} of {args.type}")
        return print(f"no tasks in group {args.group} of {args.type} in {args.queue}")
    app = load_app(args.app) if args.app else None
    found = await inspector.groups(args.queue, args.limit, args.offset, app=app)
    if out.as_json:
        return out.data(found)
    print(groups_table(out, found, app is not None) if found.groups
          else f"no task groups in {args.queue}")
    more = f"; next page: --offset {found.next_offset}" if found.next_offset else ""
    if found.total:
        print(out.paint(f"\n{len(found.groups)} shown of {found.total:,} group(s){more}",
                        "dim"))
    print(f"\n{found.batch_total} batch(es) claimed or failing" +
          (f", the first {len(found.batches)}:" if found.batch_total > len(found.batches)
           else ""))
    if found.batches:
        print(out.table(["batch", "type", "group", "tasks", "claim until (UTC)", "failures",
                         "worker", "error"], [
            [b.id, b.type, b.group, str(b.size), when(b.claim_expires_at),
             (str(b.failures), "retry" if b.failures else None), b.worker or "",
             (first_line(b.error or ""), "error")] for b in found.batches]))


async def task(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    try:
        detail = await inspector.task(args.id, args.queue)
    except TaskNotFound as exc:
        if await inspector.is_flow(args.id, args.queue):
            raise TaskNotFound(f"{args.id} is a flow's id, not a task's: obsq flow "
                               f"{args.id}") from exc
        raise
    if out.as_json:
        return out.data(detail)
    print(task_text(out, detail))


async def flow(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    info = await inspector.flow(args.id)
    if out.as_json:
        return out.data(info)
    print(flow_text(out, info))


async def flows(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    total, found = await inspector.flows(args.limit, args.offset)
    if out.as_json:
        return out.data({"total": total, "flows": found})
    print(flows_table(out, found) if found else "no flows kept")
    if total > len(found):
        print(out.paint(f"\n{len(found)} shown of {total:,} flow(s)", "dim"))


async def workers(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    found = await inspector.workers()
    if out.as_json:
        return out.data(found)
    print(workers_table(out, found) if found else "no live workers")


async def schedules(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    found = await inspector.schedules()
    if out.as_json:
        return out.data(found)
    if not found:
        print(f"no schedules in namespace {inspector.namespace!r} (those of an App's code "
              "appear once its scheduler runs)")
        return
    print(schedules_table(out, found))
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
    if args.flow or await inspector.is_flow(args.id, args.queue):
        state = await inspector.cancel(await inspector.flow(args.id))
        return print(f"cancelled flow {args.id} (it was {state})")
    state = await inspector.cancel(args.id, args.queue)
    print({"cancelled": f"cancelled task {args.id}",
           "running": f"task {args.id} is running: its worker is stopping it"}.get(
               state, f"task {args.id} had ended already ({state})"))


async def delete(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    is_flow = args.flow or await inspector.is_flow(args.id, args.queue)
    what = await inspector.flow(args.id) if is_flow else args.id
    state = await inspector.delete(what, args.queue)
    print(f"deleted {'flow' if is_flow else 'task'} {args.id} (it was {state})")


async def purge(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    depth = (await inspector.queue(args.queue)).depth[args.state]
    if depth and not args.yes:
        if not sys.stdin.isatty():
            raise ConfigurationError(f"this deletes {depth} {args.state} task(s) of "
                                     f"{args.queue}, and there is no terminal to ask: "
                                     "confirm with --yes")
        answer = input(f"delete {depth} {args.state} task(s) of {args.queue}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return
    deleted = await inspector.purge(args.queue, args.state)
    print(f"deleted {deleted} {args.state} task(s) of {args.queue}")


async def pause(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    parts = await (inspector.pause if args.command == "pause" else inspector.unpause)(
        args.queue)
    print(f"queue {args.queue} {args.command}d" + (
        f" (its {len(parts)} partitions)" if parts != [args.queue] else ""))


async def doctor(inspector: Inspector, args: argparse.Namespace, out: Output) -> None:
    healer = Doctor(inspector.broker)
    found = await healer.diagnose()
    if args.repair and found.problems:
        await healer.repair(found)
        repairs, found = found.repairs, await healer.diagnose()
        found.repairs = repairs
    notices = await healer.set_aside(found.queues) + await stalls(inspector)
    from obsq.observability import otel_metrics, tracing

    # the OTEL_* variables here, as a worker here reads them
    notices += filter(None, (tracing.missing_for_export(), otel_metrics.missing_for_export()))
    if found.problems or (notices and args.strict):
        out.status = 1
    if out.as_json:
        return out.data({"namespace": found.namespace, "queues": found.queues,
                         "clean": found.clean,
                         "problems": [{"queue": p.queue, "what": p.what, "count": p.count,
                                       "examples": p.examples} for p in found.problems],
                         "repairs": found.repairs, "notes": found.notes, "notices": notices})
    for line in found.repairs:
        print(f"repaired {line}")
    for note in found.notes:
        print(out.paint(f"info: {note}", "dim"))
    for notice in notices:
        print(out.paint(f"notice: {notice}", "retry"))
    for problem in found.problems:
        print(out.paint(problem.line(), "error"))
    if found.clean:
        queues = len(partitions_of(found.queues))  # a partitioned queue is one
        stored = (f" ({len(found.queues)} counting each partition)"
                  if queues < len(found.queues) else "")
        print(f"namespace {found.namespace!r}: {queues} queue(s){stored}, no problems"
              + (f", {len(notices)} notice(s)" if notices else ""))


HANDLERS = {"stats": stats, "queues": queues, "tasks": tasks, "task": task, "groups": groups,
            "flow": flow, "flows": flows,
            "workers": workers, "schedules": schedules, "doctor": doctor, "requeue": requeue,
            "cancel": cancel, "delete": delete, "purge": purge, "pause": pause, "unpause": pause}


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


