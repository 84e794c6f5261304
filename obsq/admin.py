"""Inspection and repair from a terminal: `obsq stats|tasks|requeue|pause|unpause`."""

from __future__ import annotations

import argparse
import time

from obsq.broker import TASK_STATES, Broker
from obsq.client import Client
from obsq.errors import ConfigurationError
from obsq.task import validate_name


async def run(command: str, redis_url: str, namespace: str, args: argparse.Namespace) -> int:
    broker = Broker(redis_url, namespace)
    try:
        await broker.check()
        if command == "stats":
            print(await stats_table(broker))
        elif command == "tasks":
            print(await tasks_table(broker, namespace, args.queue, args.state, args.limit))
        elif command == "requeue":
            moved = await broker.revive(_queue(args.queue), args.state,
                                        args.ids)
            print(f"moved {moved} task(s) from {args.state} to pending in {args.queue}")
        else:
            await broker.set_paused(_queue(args.queue), command == "pause")
            print(f"queue {args.queue} {command}d")
        return 0
    finally:
        await broker.close()


def _queue(name: str) -> str:
    """A queue name from the command line; a bad one is reported in one line."""
    try:
        return validate_name("queue", name)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


async def stats_table(broker: Broker) -> str:
    queues = await broker.queues()
    stats = await broker.queue_stats(queues)
    rows = [[q, *(str(stats[q].depth[s]) for s in TASK_STATES),
             f"{stats[q].latency:.1f}s", "yes" if stats[q].paused else ""]
            for q in queues]
    out = table(["queue", *TASK_STATES, "latency", "paused"], rows) if rows else "no queues yet"
    workers = await broker.workers()
    out += f"\n\n{len(workers)} live worker(s)"
    if workers:
        now = time.time()
        out += "\n" + table(["worker", "queues", "busy", "processed", "up"], [
            [w["id"], ",".join(w["queues"]), f"{w['busy']}/{w['concurrency']}",
             str(w.get("processed", 0)), f"{now - w['started']:.0f}s" if w["started"] else "-"]
            for w in workers])
    return out


async def tasks_table(broker: Broker, namespace: str, queue: str, state: str, limit: int) -> str:
    client = Client(broker.url, namespace, broker=broker)
    rows = []
    for task_id in await broker.list_tasks(_queue(queue), state, limit):
        info = await client.info(task_id, queue)
        when = info.next_run_at or info.completed_at or info.enqueued_at
        rows.append([info.id, info.type, str(info.retry_count),
                     when.strftime("%Y-%m-%d %H:%M:%S") if when else "",
                     (info.error or "")[:80]])
    if not rows:
        return f"no {state} tasks in {queue}"
    return table(["id", "type", "retries", "time (UTC)", "error"], rows)
