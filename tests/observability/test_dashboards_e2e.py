"""Every query of the Grafana dashboards and every alert rule, run by a real Prometheus
against a real worker after a scripted workload: each one evaluates without error or
warning and returns data (a number, not NaN; for a query over a rate, a positive one in the
last minute), and the rules file loads and evaluates cleanly.

The worker serves two queues. The workload gives every series the queries read: the
outcomes success, retry, dead and lease_lost, both lease recovery reasons (expired, and
worker_lost from a third queue), a paused queue with pending tasks of two fairness keys, a
dead-letter set, a failed Redis call, a group of tasks aggregated into one (after a failed
try), an event
delivered to its subscriber, a task that expired before it started, a task moved from an
outbox by its relay, a Redis found to have lost its data (another dataset token),
and a scheduler in the same process firing an entry every second, whose next fire is set
back a minute in each wave, as after an outage of the schedulers, to miss fires. It runs
in two waves with a scrape in between, so the counters and histograms grow while
Prometheus watches and `rate()` has something to measure (a series first seen at its final
value has a rate of 0, and a histogram quantile or a failure ratio of 0/0 is NaN, not
data).

No query is exempt.
"""

from __future__ import annotations

import asyncio
import collections
import math
import re
import time
from datetime import datetime
from typing import Any

from deploy.promql import alert_queries, dashboard_queries
from prometheus_client import REGISTRY
from sqlalchemy import create_engine
from support import wait_until

import obsq
from obsq.broker import Broker, GlobalKeys, QueueKeys, ScheduleKeys
from obsq.observability import instrument_client
from obsq.outbox import Outbox, Relay
from obsq.outbox.metrics import watch_relay

from .helpers import (
    ROOT,
    PrometheusServer,
    missing_tool,
    parse,
    prometheus_binary,
    scrape,
    value,
)

DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULES = ROOT / "alerts" / "obsq.rules.yml"
# Grafana's $__rate_interval is at least four scrape intervals; 15 s holds a dozen samples
# at the 1 s scrapes here, where Grafana's 1m would blur the two waves together.
RATE_INTERVAL = "15s"
RANGE_SECONDS = 60

# Handler runs of each wave on the main queue, by (task, outcome).
OUTCOMES = {("easy", "success"): 3, ("flaky", "retry"): 1, ("flaky", "success"): 1,
            ("doomed", "retry"): 1, ("doomed", "dead"): 1, ("slow", "success"): 1,
            ("slow", "lease_lost"): 1, ("gated", "cancelled"): 1, ("gated", "success"): 1,
            ("merged", "success"): 1, ("e2e.paid@ledger", "success"): 1,
            ("stale", "expired"): 1, ("relayed", "success"): 1}


# --- PromQL helpers -----------------------------------------------------------------------

SET_OPERATOR = re.compile(r"\s(and|or|unless)\b(\s*(on|ignoring)\s*\([^)]*\))?\s*")
COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)\s*(bool\s+)?[-+0-9.e]+\s*$")


def _top_level(expr: str) -> list[bool]:
    """For each character: is it outside every (), {}, [] and string?"""
    depth, quote, flags = 0, "", []
    for i, ch in enumerate(expr):
        if quote:
            if ch == quote and expr[i - 1] != "\\":
                quote = ""
            flags.append(False)
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        flags.append(depth == 0 and not quote and ch not in ")]}")
    return flags


def _unwrap(expr: str) -> str:
    """Drop parentheses that enclose the whole expression."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and not any(_top_level(expr)[:-1]):
        expr = expr[1:-1].strip()
    return expr


def alert_operands(expr: str) -> list[str]:
    """The expressions an alert compares with its thresholds: the operands of top-level
    and/or/unless, each with a trailing `> N` (or <, >=, <=, ==, !=) stripped.

    `max(x) < 1 and on (ns) max(y) > 0` -> ["max(x)", "max(y)"]."""
    expr = _unwrap(expr)
    top = _top_level(expr)
    parts, start = [], 0
    for match in SET_OPERATOR.finditer(expr):
        if top[match.start()] and top[match.start(1)]:
            parts.append(expr[start:match.start()])
            start = match.end()
    parts.append(expr[start:])
    operands = []
    for part in parts:
        part = _unwrap(part)
        flags = _top_level(part)
        match = COMPARISON.search(part)
        if match and flags[match.start()]:
            part = part[:match.start()]
        operands.append(_unwrap(part))
    return operands


def test_alert_operands() -> None:
    assert alert_operands("max by (a) (x) > 300") == ["max by (a) (x)"]
    assert alert_operands("max(x) < 1\nand on (ns)\nmax(y{s=\"p\"}) > 0") == [
        "max(x)", 'max(y{s="p"})']
    assert alert_operands("(\n sum(rate(a[5m]))\n/\n sum(rate(b[5m]))\n) > 0.1") == [
        "sum(rate(a[5m]))\n/\n sum(rate(b[5m]))"]
    assert alert_operands("(a) / (b)") == ["(a) / (b)"]
    assert alert_operands('sum(x{op=~"a>b"})') == ['sum(x{op=~"a>b"})']


def uses_rate(expr: str) -> bool:
    return bool(re.search(r"\b(rate|irate|increase|delta)\(", expr))


def finite(result: list[dict[str, Any]]) -> list[float]:
    """The numbers of an instant or range result that are not NaN."""
    points = []
    for series in result:
        for _, v in series.get("values") or [series["value"]]:
            if not math.isnan(float(v)):
                points.append(float(v))
    return points


def evaluate(prom: PrometheusServer, expr: str, *, over_range: bool) -> list[dict[str, Any]]:
    """Run `expr` at now and, for `over_range`, over the last minute too; assert that
    Prometheus answers with success, no error and no warning. Returns the result that
    must hold data."""
    instant = prom.reply("query", query=expr)
    assert not instant.get("warnings"), instant
    if not over_range:
        return instant["data"]["result"]
    end = time.time()
    ranged = prom.reply("query_range", query=expr, start=end - RANGE_SECONDS, end=end, step=1)
    assert not ranged.get("warnings"), ranged
    return ranged["data"]["result"]


def _rfc3339(text: str) -> float:
    """Prometheus's timestamps carry nanoseconds; Python parses microseconds."""
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()


# --- the test -----------------------------------------------------------------------------

async def test_every_dashboard_query_and_alert_returns_data(
        app, client, client_without_app, redis_url, namespace, raw_redis, start_worker,
        start_scheduler, prometheus, tmp_path):
    if prometheus_binary() is None:  # before the workload, not after it
        missing_tool("prometheus is not on PATH (apt-get install prometheus)")
    main, side, away = f"e2e-{namespace}", f"e2e-side-{namespace}", f"e2e-away-{namespace}"
    attempts: collections.Counter[str] = collections.Counter()
    releases: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)

    @app.task("easy", queue=main)
    async def easy(task):
        await asyncio.sleep(0.002 * (task.payload or {}).get("i", 0))

    @app.task("flaky", queue=main, retry_delay=0)
    async def flaky(task):
        if task.retry_count < 1:
            raise ConnectionError("not yet")

    @app.task("doomed", queue=main, max_retry=1, retry_delay=0)
    async def doomed(task):
        raise ValueError("never")

    @app.task("slow", queue=main)
    async def slow(task):
        attempts[task.id] += 1
        if attempts[task.id] == 1:
            await releases[task.id].wait()  # meanwhile its lease runs out, it runs again

    @app.task("gated", queue=main, concurrency=1)
    async def gated(task):
        if task.payload == "hold":
            await asyncio.sleep(60)  # until cancelled

    @app.task("merged", queue=main)
    async def merged(task):
        assert len(task.payload) == 2

    failed_once: set[str] = set()

    def merge(group, tasks):
        """Fails its first run for each group (the batch is tried again a second later)."""
        if group not in failed_once:
            failed_once.add(group)
            raise RuntimeError("not yet")
        return "merged", [t.payload for t in tasks]

    app.aggregate("rows:", merge, max_size=2, grace_period=0.1)

    @app.subscribe("e2e.paid", name="ledger", queue=main)
    async def ledger(task):
        pass

    @app.task("stale", queue=main)
    async def stale(task):
        raise AssertionError("an expired task never runs")

    @app.task("relayed", queue=main)
    async def relayed(task):
        pass

    # an outbox on SQLite, its relay's metrics served with the worker's
    engine = create_engine(f"sqlite:///{tmp_path / 'outbox.db'}")
    outbox = Outbox(engine, app=app)  # its routes give the queue
    outbox.create_table()
    relay = Relay(engine, client)
    watched = watch_relay(relay)

    instrument_client(client)  # the enqueued counter
    admin = Broker(redis_url, namespace)
    clock = obsq.App(namespace=namespace)
    clock.periodic("@every 1s", "tick", name="e2e-tick", queue=f"e2e-clock-{namespace}",
                   missed="skip")
    await start_scheduler(clock, metrics=True)
    worker = await start_worker(queues={main: 2, side: 1}, metrics=True, http_port=0,
                                lease_seconds=60)
    port = start_worker.port(worker)
    # The worker's target carries the labels the chart's ServiceMonitor gives it. This one
    # process also plays the scheduler and the exporter (its endpoint has their series):
    # targets of those components on the same endpoint, of which only `up` is kept, give
    # the alerts on their `up` something to read.
    installation = {"namespace": namespace, "app_kubernetes_io_instance": "e2e",
                    "app_kubernetes_io_part_of": "obsq"}
    components = [{"targets": [f"127.0.0.1:{port}"],
                   "labels": {**installation, "app_kubernetes_io_component": role}}
                  for role in ("scheduler", "exporter")]
    drop_roles = [{"source_labels": ["app_kubernetes_io_component"],
                   "regex": "scheduler|exporter", "action": "drop"}]
    starting = asyncio.create_task(asyncio.to_thread(
        prometheus, [f"127.0.0.1:{port}"], rule_files=[RULES],
        labels={**installation, "app_kubernetes_io_component": "worker"},
        static_configs=components, metric_relabel_configs=drop_roles))
    t0 = time.monotonic()

    async def scraped(name: str, **labels: str) -> float:
        return value(parse(await asyncio.to_thread(scrape, port)), name, **labels)

    async def until_counted(expected: float, name: str, **labels: str) -> None:
        async def counted() -> bool:
            return await scraped(name, **labels) == expected
        await wait_until(counted, timeout=15, what=f"{name}{labels} == {expected}")

    async def expire_a_lease() -> None:
        """A slow task whose lease runs out: recovered (expired), run again (success),
        and its first attempt's late result refused (lease_lost)."""
        info = await client.enqueue("slow")
        await wait_until(lambda: attempts[info.id] == 1, what="the slow task started")
        raw_redis.zadd(QueueKeys(namespace, main).lease, {info.id: 1})
        await wait_until(lambda: attempts[info.id] == 2, what="the slow task ran again")
        releases[info.id].set()

    async def lose_a_worker(ghost: str) -> None:
        """A task held by a worker that stopped heartbeating, in a queue nobody serves."""
        await client.enqueue("easy", {}, queue=away)
        _, fetched = await admin.dequeue(away, 1, ghost, 60)
        taken = fetched.tasks
        assert len(taken) == 1
        raw_redis.zadd(GlobalKeys(namespace).workers, {ghost: int((time.time() - 60) * 1000)})

    async def fail_a_redis_call() -> None:
        """A key of the wrong type makes the queue gauges' read fail (WRONGTYPE), which
        the worker's broker counts under its operation, "stats"."""
        before = await scraped("obsq_redis_errors_total", operation="stats")
        broken = QueueKeys(namespace, side).completed
        raw_redis.set(broken, "not a sorted set")
        try:
            async def failed() -> bool:
                return await scraped("obsq_redis_errors_total", operation="stats") > before
            await wait_until(failed, timeout=10, what="a Redis error counted")
        finally:
            raw_redis.delete(broken)

    async def miss_fires() -> None:
        """The entry's next fire a minute ago: the fires older than missed_after are
        missed, the others enqueued late."""
        before = await scraped("obsq_scheduler_missed_total", entry="e2e-tick")
        raw_redis.zadd(ScheduleKeys(namespace).next,
                       {"e2e-tick": (raw_redis.time()[0] - 60) * 1000})

        async def missed() -> bool:
            return await scraped("obsq_scheduler_missed_total", entry="e2e-tick") > before
        await wait_until(missed, timeout=10, what="missed fires counted")

    async def hold_back_and_cancel() -> None:
        """Two tasks of a route limited to one at a time: the second is held back
        (throttled, again each time the forwarder lets it out to be checked), until the
        first, cancelled while it runs, gives its slot back."""
        labels = {"queue": main, "task": "gated", "reason": "concurrency"}
        before = await scraped("obsq_tasks_throttled_total", **labels)
        holding = await client.enqueue("gated", "hold")
        await client.enqueue("gated", "quick")

        async def throttled() -> bool:
            return await scraped("obsq_tasks_throttled_total", **labels) > before
        await wait_until(throttled, timeout=15, what="a held-back start counted")
        assert await client.cancel(holding.id) == "running"

    async def lose_the_dataset(n: int) -> None:
        """Another dataset token, as after a Redis restarted empty: the worker's heartbeat
        counts a data loss."""
        raw_redis.set(GlobalKeys(namespace).dataset, f"restarted-{n}")
        await until_counted(n, "obsq_redis_data_lost_total")

    async def hand_on_an_unknown_type(n: int) -> None:
        """A task no handler knows (from a producer without the App): handed on, and again
        every few seconds from then on (wave 1's too), so the count reaches at least n."""
        await client_without_app.enqueue(f"unknown:{n}", queue=main)

        async def handed_on() -> bool:
            return await scraped("obsq_tasks_unknown_type_total", queue=main,
                                 outcome="handed_on") >= n
        await wait_until(handed_on, timeout=15, what="a task of an unknown type handed on")

    async def wave(n: int) -> None:
        """The same work each time: every outcome, both recovery reasons, a held-back start,
        a Redis error, fires and missed fires, an aggregation, an event's delivery, a
        Redis that lost its data and a task of a type no worker knows."""
        for i in range(3):
            await client.enqueue("easy", {"i": i})
        for i in range(2):
            await client.enqueue("rows:add", i, queue=main, group=f"wave-{n}")
        assert len(await client.publish("e2e.paid", {"wave": n})) == 1
        await client.enqueue("flaky")
        await client.enqueue("doomed")
        await client.enqueue("stale", delay=0.3, expires=0.1)  # due after its expiry
        with engine.begin() as conn:
            outbox.enqueue(conn, "relayed", {"wave": n})
        assert await relay.relay_batch() == 1
        twice = obsq.Job("easy", {}, task_id=f"twice-{n}-{namespace}", delay=3600)
        assert [i.duplicate for i in await client.enqueue_many([twice, twice])] == [
            False, True]  # a refused enqueue
        await expire_a_lease()
        await hold_back_and_cancel()
        await lose_a_worker(f"ghost-{n}")
        await fail_a_redis_call()
        await miss_fires()
        await lose_the_dataset(n)
        await hand_on_an_unknown_type(n)
        for (task, outcome), runs in OUTCOMES.items():
            await until_counted(runs * n, "obsq_tasks_processed_total", queue=main, task=task,
                                outcome=outcome)
        for outcome in ("failed", "success"):
            await until_counted(n, "obsq_aggregations_total", queue=main, task="rows:",
                                outcome=outcome)
        await until_counted(n, "obsq_lease_recoveries_total", queue=main, reason="expired")
        await until_counted(n, "obsq_lease_recoveries_total", queue=away, reason="worker_lost")

    # Wave 1, while Prometheus starts; the side queue runs two tasks, then is paused with
    # two waiting, of two fairness keys.
    for i in range(2):
        await client.enqueue("easy", {"i": i}, queue=side)
    await until_counted(2, "obsq_tasks_processed_total", queue=side, task="easy",
                        outcome="success")
    await admin.set_paused(side, True)
    for tenant in ("tenant-a", "tenant-b"):
        await client.enqueue("easy", {}, queue=side, fairness_key=tenant)
    await wave(1)

    # Wave 2 once Prometheus has scraped wave 1: every counter and histogram grows while
    # it watches.
    prom = await starting
    processed = f'sum(obsq_tasks_processed_total{{queue="{main}"}})'
    runs = sum(OUTCOMES.values())
    await prom.wait_for(processed, lambda r: r and float(r[0]["value"][1]) == runs, timeout=20)
    await prom.wait_for('obsq_redis_errors_total{operation="stats"}', timeout=10)
    await wave(2)
    await prom.wait_for(processed, lambda r: r and float(r[0]["value"][1]) == 2 * runs,
                        timeout=10)
    await prom.wait_for(f'obsq_lease_recoveries_total{{queue="{away}"}} == 2', timeout=10)
    await prom.wait_for(f'obsq_queue_depth{{queue="{side}", state="pending"}} == 2',
                        timeout=10)
    in_prometheus = time.time()

    # The rules file: every rule loaded and evaluated after wave 2 without error; the dead
    # tasks of wave 2 fire ObsqDeadTasksGrowing (it has no `for`).
    def rules_evaluated() -> dict[str, dict[str, Any]]:
        rules = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
        fresh = all(_rfc3339(r["lastEvaluation"]) > in_prometheus + 1 for r in rules.values())
        return rules if fresh and rules["ObsqDeadTasksGrowing"]["state"] == "firing" else {}

    rules = await wait_until(lambda: asyncio.to_thread(rules_evaluated), timeout=10,
                             interval=0.5, what="two evaluations of the rules")
    assert set(rules) == {name for name, _ in alert_queries(RULES)}
    for rule in rules.values():
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
    firing = {(a["labels"]["queue"], a["labels"]["task"])
              for a in rules["ObsqDeadTasksGrowing"]["alerts"] if a["state"] == "firing"}
    assert (main, "doomed") in firing, firing

    failures: list[str] = []
    checked = 0

    def check(where: str, expr: str, over_range: bool) -> None:
        """Data: a number that is not NaN; for a rate, a positive one somewhere in the
        last minute (the workload made every counter grow while Prometheus watched)."""
        nonlocal checked
        result = evaluate(prom, expr, over_range=over_range)
        points = finite(result)
        checked += 1
        if not points or (over_range and max(points) <= 0):
            failures.append(f"{where}: {expr!r} -> {result}")

    # Every alert expression evaluates; what it compares with its threshold has data.
    for name, expr in alert_queries(RULES):
        await asyncio.to_thread(evaluate, prom, expr, over_range=False)
        for operand in alert_operands(expr):
            await asyncio.to_thread(check, f"alert {name}", operand, uses_rate(operand))

    # Every dashboard panel query, first with its variables set to All, then to the two
    # queues of this test (so that the data is this workload's, not that of an earlier
    # test in the same process: the metrics live in the process-wide registry).
    selections = [{"queue": ".*", "task": ".*"}, {"queue": f"{main}|{side}", "task": ".*"}]
    for path in DASHBOARDS:
        for values in selections:
            variables = {**values, "__rate_interval": RATE_INTERVAL}
            for title, expr in dashboard_queries(path, variables):
                await asyncio.to_thread(check, f"{path.name} / {title} ($queue="
                                        f"{values['queue']})", expr, uses_rate(expr))
    assert not failures, "queries without data:\n" + "\n".join(failures)
    assert checked == (sum(len(alert_operands(e)) for _, e in alert_queries(RULES))
                       + 2 * sum(len(dashboard_queries(p)) for p in DASHBOARDS))
    print(f"{checked} queries returned data, {time.monotonic() - t0:.1f} s after the start")
    await admin.close()
    REGISTRY.unregister(watched)
    engine.dispose()
