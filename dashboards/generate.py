"""Generate the obsq Grafana dashboards from code.

    python dashboards/generate.py [OUTPUT_DIR]

writes ``obsq-overview.json`` and ``obsq-task.json`` (default: next to this file). The
JSON files are committed; ``tests/deploy`` regenerates them into a temporary folder
and fails when they differ, so edit this file and rerun it rather than editing JSON.

Every query uses only the metric names of the observability contract (DESIGN.md,
section 4), and is scoped by the ``namespace`` and ``installation`` variables: the
Kubernetes namespace and the Helm release (``app_kubernetes_io_instance``, the target
label the chart's ServiceMonitor and PodMonitor set). Queue-wide gauges
(``obsq_queue_*``, ``obsq_workers``) come from one exporter per installation, whose
replicas (or the workers outside the chart) export the same values: they are reduced
with ``max`` per installation and series (a queue, a state), then summed. Per-process
series (counters, histograms, ``obsq_tasks_in_progress``, ``obsq_worker_concurrency``,
``obsq_worker_stuck_slots``) are summed. Latency panels show the histograms' trace-id
exemplars.

Producers (a web app that enqueues) are often scraped under a job of their own, without
the installation's target labels: their panels (enqueued, refused) keep the series of
any producer that either carries the selected installation or no installation at all, in
the queues that the selected installations have (``and on (queue)`` their queue gauges).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
FAILED = 'outcome=~"retry|dead"'
QUANTILES = ("0.5", "0.95", "0.99")
TAGS = ["obsq"]
# One installation: its Kubernetes namespace and its Helm release.
INSTALLATION = "namespace, app_kubernetes_io_instance"
SCOPE = 'namespace=~"$namespace", app_kubernetes_io_instance=~"$installation"'
# Series that every installation has, whichever of its processes is scraped.
ANY_PROCESS = '__name__=~"obsq_workers|obsq_build_info"'
# Producers: those of the selected installations, and those scraped without its labels.
PRODUCER_SCOPE = 'app_kubernetes_io_instance=~"$installation|"'
# The labels that tell a queue-wide gauge's series apart within one installation.
GAUGE_SERIES = {"obsq_queue_depth": "queue, state", "obsq_workers": "",
                "obsq_queue_fairness_keys": "queue",
                "obsq_queue_fairness_key_waiting": "queue, key"}


# --- small builders ---------------------------------------------------------------------


def query(expr: str, legend: str = "", ref: str = "A", *, exemplar: bool = False
          ) -> prometheus.Dataquery:
    """A Prometheus target; `exemplar`: with the trace-id exemplars of the histogram it
    reads (Grafana links them to the trace through the data source's exemplar setting)."""
    target = (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend or "__auto")
        .ref_id(ref)
        .datasource(DATASOURCE)
    )
    return target.exemplar(True) if exemplar else target


def queries(*pairs: tuple[str, str], exemplar: bool = False) -> list[prometheus.Dataquery]:
    return [query(expr, legend, chr(ord("A") + i), exemplar=exemplar)
            for i, (expr, legend) in enumerate(pairs)]


def per_installation(gauge: str, selector: str, by: str = "") -> str:
    """A queue-wide gauge summed over the selected installations and its series, each
    counted once (``max`` over the processes of an installation that export it, kept
    apart per series: the dead tasks of two queues add up)."""
    grouping = f" by ({by})" if by else ""
    inner = ", ".join(filter(None, (INSTALLATION, GAUGE_SERIES[gauge])))
    return f"sum{grouping} (max by ({inner}) ({gauge}{{{selector}}}))"


def produced(metric: str, selector: str, by: str) -> str:
    """A producer counter's rate by `by` (which holds `queue`), kept to the queues of the
    selected installations: producers scraped under a job of their own lack its labels."""
    return (
        f"{rate(metric, f'{PRODUCER_SCOPE}, {selector}', by)}\n"
        f"and on (queue)\n"
        f'max by ({INSTALLATION}, queue) (obsq_queue_depth{{{SCOPE}, queue=~"$queue"}})'
    )


def thresholds(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=v, color=c) for v, c in steps])
    )


def graph(
    title: str,
    description: str,
    unit: str,
    targets: list[prometheus.Dataquery],
    *,
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    bars: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(targets)
        .unit(unit)
        .min(0)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .line_width(1)
        .show_points(common.VisibilityMode.NEVER)
        .legend(legend().display_mode(common.LegendDisplayMode.TABLE).calcs(["mean", "max"]))
        .tooltip(tooltip())
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    return panel


def legend() -> VizLegendOptions:
    return VizLegendOptions().show_legend(True).placement(common.LegendPlacement.BOTTOM)


def tooltip() -> VizTooltipOptions:
    return (
        VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
    )


def single(
    title: str,
    description: str,
    unit: str,
    expr: str,
    steps: list[tuple[float | None, str]],
    *,
    legend: str = "",
    width: int = 4,
    height: int = 4,
    mappings: list[model.ValueMap] | None = None,
) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, legend))
        .unit(unit)
        .span(width)
        .height(height)
        .thresholds(thresholds(*steps))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .no_value("0")
    )
    if mappings:
        panel = panel.mappings(mappings)
    return panel


def row(title: str) -> dash.Row:
    return dash.Row(title).collapsed(False)


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(
    name: str, label: str, expr: str, *, include_all: bool = True, multi: bool = True
) -> dash.QueryVariable:
    variable = (
        dash.QueryVariable(name)
        .label(label)
        .query(expr)
        .datasource(DATASOURCE)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        variable = variable.all_value(".*").current(
            model.VariableOption(selected=True, text="All", value="$__all")
        )
    return variable


def installation_variables() -> list[dash.QueryVariable]:
    """`namespace` and `installation` (the Helm release), which scope every query."""
    return [
        query_variable("namespace", "Namespace", f"label_values({{{ANY_PROCESS}}}, namespace)"),
        query_variable(
            "installation",
            "Installation",
            f'label_values({{{ANY_PROCESS}, namespace=~"$namespace"}}, '
            "app_kubernetes_io_instance)",
        ),
    ]


def links() -> list[dash.DashboardLink]:
    return [
        dash.DashboardLink("obsq dashboards")
        .type(model.DashboardLinkType.DASHBOARDS)
        .tags(TAGS)
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
    ]


def base(uid: str, title: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .links(links())
    )


# --- queries shared by both dashboards ----------------------------------------------------


def rate(metric: str, selector: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{selector}}}[{RATE}]))"


def failure_ratio(selector: str, by: str = "") -> str:
    return (
        f"{rate('obsq_tasks_processed_total', f'{selector}, {FAILED}', by)}\n/\n"
        f"{rate('obsq_tasks_processed_total', selector, by)}"
    )


def histogram_quantiles(metric: str, selector: str, legend_prefix: str = "") -> list:
    """(expr, legend) of the p50, p95 and p99 of a histogram."""
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{legend_prefix}p{round(float(q) * 100)}",
        )
        for q in QUANTILES
    ]


def task_panels(sel: str) -> list[tuple[str, list]]:
    """Rows of panels over the task-labelled series, for the selector ``sel`` (of the
    installation's processes; the producer panels drop its SCOPE)."""
    psel = sel.replace(f"{SCOPE}, ", "")
    return [
        (
            "Throughput",
            [
                graph(
                    "Throughput by outcome",
                    "Handler runs finished per second, by outcome: success, retry (failed, "
                    "scheduled again), dead (failed for good), cancelled (stopped because its "
                    "task was cancelled), expired (not started by its expiry, dead unrun), "
                    "requeued (handed back at shutdown), lease_lost "
                    "(finished after its lease was taken over), unrecorded (finished while "
                    "Redis stayed away until its worker stopped).",
                    "ops",
                    queries((rate("obsq_tasks_processed_total", sel, "outcome"), "{{outcome}}")),
                    stacked=True,
                ),
                graph(
                    "Failure ratio",
                    'Share of handler runs that failed (outcome=~"retry|dead"), per queue.',
                    "percentunit",
                    queries((failure_ratio(sel, "queue"), "{{queue}}")),
                ),
                graph(
                    "Enqueued",
                    "Tasks enqueued per second by the producers that export metrics, per "
                    "queue and task: the installation's own processes, and producers scraped "
                    "without its labels (a web app under a job of its own) in its queues.",
                    "ops",
                    queries((produced("obsq_tasks_enqueued_total", psel, "queue, task"),
                             "{{queue}} {{task}}")),
                ),
                graph(
                    "Retries, dead and expired tasks",
                    "Runs that failed and were scheduled again (retry) or sent to the "
                    "dead-letter set (dead), and tasks that ended there unstarted past their "
                    "expiry (expired), per task.",
                    "ops",
                    queries(
                        (
                            rate(
                                "obsq_tasks_processed_total",
                                f'{sel}, outcome="retry"',
                                "queue, task",
                            ),
                            "retry {{queue}} {{task}}",
                        ),
                        (
                            rate("obsq_tasks_processed_total", f'{sel}, outcome="dead"',
                                 "queue, task"),
                            "dead {{queue}} {{task}}",
                        ),
                        (
                            rate("obsq_tasks_processed_total", f'{sel}, outcome="expired"',
                                 "task"),
                            "expired {{task}}",
                        ),
                    ),
                    bars=True,
                ),
            ],
        ),
        (
            "Limits and cancellations",
            [
                graph(
                    "Throttled starts by reason",
                    "Starts held back per second: concurrency (a route's limit across "
                    "workers, or a worker's own), rate (a route's rate limit) or ordering (a "
                    "task ahead on its ordering key). A held-back task waits; it neither "
                    "fails nor spends a retry.",
                    "ops",
                    queries((rate("obsq_tasks_throttled_total", sel, "reason, queue, task"),
                             "{{reason}} {{queue}} {{task}}")),
                    stacked=True,
                ),
                graph(
                    "Cancelled runs",
                    "Handler runs stopped because their task was cancelled (client.cancel, "
                    "obsq cancel, the console), per task.",
                    "ops",
                    queries((rate("obsq_tasks_processed_total", f'{sel}, outcome="cancelled"',
                                  "queue, task"), "{{queue}} {{task}}")),
                    bars=True,
                ),
            ],
        ),
        (
            "Latency",
            [
                graph(
                    "Task duration p50 / p95 / p99",
                    "Handler run time, from the obsq_task_duration_seconds histogram.",
                    "s",
                    queries(*histogram_quantiles("obsq_task_duration_seconds", sel),
                            exemplar=True),
                ),
                graph(
                    "Task wait p50 / p95 / p99",
                    "Time from the moment a task was due to its start (queueing latency; "
                    "deliberate delays excluded), from the obsq_task_wait_seconds histogram.",
                    "s",
                    queries(*histogram_quantiles("obsq_task_wait_seconds", sel),
                            exemplar=True),
                ),
            ],
        ),
    ]


# --- overview -------------------------------------------------------------------------------


def overview() -> dash.Dashboard:
    sel = f'{SCOPE}, queue=~"$queue", task=~"$task"'
    qsel = f'{SCOPE}, queue=~"$queue"'
    board = base(
        "obsq-overview",
        "obsq / Overview",
        "obsq task queues: throughput, failures, queue depth and latency, workers, Redis, "
        "schedules, groups and events.",
    ).with_variable(datasource_variable())
    for variable in installation_variables():
        board = board.with_variable(variable)
    board = board.with_variable(
        query_variable("queue", "Queue", f"label_values(obsq_queue_depth{{{SCOPE}}}, queue)")
    ).with_variable(
        query_variable(
            "task",
            "Task",
            f'label_values(obsq_tasks_processed_total{{{SCOPE}, queue=~"$queue"}}, task)',
        )
    )

    board = board.with_row(row("Summary"))
    for panel in [
        single(
            "Throughput",
            "Handler runs finished per second, all outcomes.",
            "ops",
            f"sum(rate(obsq_tasks_processed_total{{{sel}}}[{RATE}]))",
            [(None, "blue")],
        ),
        single(
            "Failure ratio",
            'Share of handler runs that failed (outcome=~"retry|dead").',
            "percentunit",
            failure_ratio(sel),
            [(None, "green"), (0.05, "orange"), (0.1, "red")],
        ),
        single(
            "Oldest pending task",
            "Age of the oldest pending task over the selected queues.",
            "s",
            f"max(obsq_queue_latency_seconds{{{qsel}}})",
            [(None, "green"), (60, "orange"), (300, "red")],
        ),
        single(
            "Dead tasks",
            "Tasks in the dead-letter sets of the selected queues.",
            "short",
            per_installation("obsq_queue_depth", f'{qsel}, state="dead"'),
            [(None, "green"), (1, "orange")],
        ),
        single(
            "Live workers",
            "Workers registered in Redis with a fresh heartbeat.",
            "short",
            per_installation("obsq_workers", SCOPE),
            [(None, "red"), (1, "green")],
        ),
        single(
            "Running versions",
            "obsq versions of the processes that are scraped, with their count.",
            "short",
            f"count by (version) (obsq_build_info{{{SCOPE}}})",
            [(None, "blue")],
            legend="{{version}}",
        ),
    ]:
        board = board.with_panel(panel)

    for title, panels in task_panels(sel):
        board = board.with_row(row(title))
        for panel in panels:
            board = board.with_panel(panel)

    board = board.with_row(row("Queues"))
    for panel in [
        graph(
            "Queue depth by state",
            "Tasks per queue and state (pending, active, scheduled, retry, dead, completed, "
            "cancelled, aggregating), read from Redis at scrape time.",
            "short",
            queries((per_installation("obsq_queue_depth", qsel, "queue, state"),
                     "{{queue}} {{state}}")),
        ),
        graph(
            "Queue latency",
            "Age of the oldest pending task, per queue.",
            "s",
            queries((f"max by (queue) (obsq_queue_latency_seconds{{{qsel}}})", "{{queue}}")),
        ),
        graph(
            "Dead-letter sets",
            "Tasks in each queue's dead set; they stay there until requeued or removed "
            "(obsq tasks QUEUE dead, obsq requeue).",
            "short",
            queries((per_installation("obsq_queue_depth", f'{qsel}, state="dead"', "queue"),
                     "{{queue}}")),
        ),
        single(
            "Paused queues",
            "1 when a queue is paused (obsq pause QUEUE); a partitioned queue when all its "
            "partitions are (obsq queues QUEUE shows each).",
            "short",
            f"max by (queue) (obsq_queue_paused{{{qsel}}})",
            [(None, "green"), (1, "orange")],
            legend="{{queue}}",
            width=12,
            height=8,
            mappings=[
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="running", color="green", index=0),
                        "1": model.ValueMappingResult(text="paused", color="orange", index=1),
                    }
                )
            ],
        ),
        graph(
            "Fairness keys waiting",
            "Fairness keys (fairness_key=, a tenant) with tasks waiting in each queue, and "
            "the waiting tasks of the ten keys with most: the keys start tasks in turn, so "
            "one key's backlog delays another key's task by one turn at most.",
            "short",
            queries(
                (per_installation("obsq_queue_fairness_keys", qsel, "queue"),
                 "{{queue}} keys"),
                (per_installation("obsq_queue_fairness_key_waiting", qsel, "queue, key"),
                 "{{queue}} {{key}}"),
            ),
        ),
        single(
            "Partitions",
            "Partitions each queue is stored as (app.queue(name, partitions=N)), as its "
            "workers declare them; the queue panels sum them under the queue's name.",
            "short",
            f"max by (queue) (obsq_queue_partitions{{{qsel}}})",
            [(None, "blue")],
            legend="{{queue}}",
            width=12,
            height=8,
        ),
    ]:
        board = board.with_panel(panel)

    board = board.with_row(row("Workers"))
    for panel in [
        graph(
            "In progress vs concurrency",
            "Tasks running now against the task slots of all scraped worker processes, "
            "and the stuck slots: plain handlers past their timeout, still holding their "
            "slots.",
            "short",
            queries(
                (f"sum(obsq_tasks_in_progress{{{sel}}})", "in progress"),
                (f"sum(obsq_worker_concurrency{{{SCOPE}}})", "concurrency"),
                (f"sum(obsq_worker_stuck_slots{{{SCOPE}}})", "stuck"),
            ),
        ),
        graph(
            "Live workers",
            "Workers registered in Redis with a fresh heartbeat.",
            "short",
            queries((per_installation("obsq_workers", SCOPE), "workers")),
        ),
        graph(
            "Lease recoveries by reason",
            "Tasks taken back from a worker: expired (lease ran out) or worker_lost (its "
            "worker stopped heartbeating). A burst means workers are dying.",
            "ops",
            queries(
                (
                    rate("obsq_lease_recoveries_total", qsel, "queue, reason"),
                    "{{queue}} {{reason}}",
                )
            ),
            bars=True,
        ),
        graph(
            "Tasks of unknown types",
            "Tasks a worker took without a handler for their type: handed_on (back to the "
            "queue for a worker that has one, no retry spent: usual during a rolling deploy) "
            "or dead (handed on for longer than OBSQ_UNKNOWN_TYPE_MAX_AGE, 24 h). Dead ones "
            "mean no worker of this installation knows the type.",
            "ops",
            queries((rate("obsq_tasks_unknown_type_total", qsel, "queue, outcome"),
                     "{{queue}} {{outcome}}")),
            bars=True,
        ),
        graph(
            "Event loop lag and fetch stalls",
            "How long each worker's event loop has been blocked now (a handler calling "
            "blocking code in an async def); 0 while it runs. Tasks of a blocked loop do not "
            "start; its heartbeats and lease extensions go on from their own thread, and "
            "liveness fails past OBSQ_BLOCKED_LOOP_LIMIT (60 s). And how long its fetch loop "
            "has gone without coming round (Redis unreachable, a dropped connection): it "
            "takes no task meanwhile, and /readyz fails.",
            "s",
            queries((f"max by (instance) (obsq_worker_event_loop_lag_seconds{{{SCOPE}}})",
                     "{{instance}} loop lag"),
                    (f"max by (instance) (obsq_worker_fetch_stalled_seconds{{{SCOPE}}})",
                     "{{instance}} fetch stalled")),
        ),
        graph(
            "Redis lost its data",
            "Times a worker found that Redis had lost its data (restarted without "
            "persistence, or flushed): the tasks that were in it are gone.",
            "short",
            queries((f"sum(increase(obsq_redis_data_lost_total{{{SCOPE}}}[{RATE}]))",
                     "data lost")),
            bars=True,
        ),
        graph(
            "Redis errors by operation",
            "Failed Redis calls per second.",
            "ops",
            queries(
                (
                    rate("obsq_redis_errors_total", SCOPE, "operation"),
                    "{{operation}}",
                )
            ),
            bars=True,
        ),
    ]:
        board = board.with_panel(panel)

    board = board.with_row(row("Redis and producers"))
    for panel in [
        graph(
            "Redis memory",
            "Memory Redis uses against its maxmemory (0: no limit). Producers are refused "
            "from their memory_share of it on (90 % by default); workers never are, so they "
            "drain the queues.",
            "bytes",
            queries(
                (f"max by ({INSTALLATION}) (obsq_redis_memory_used_bytes{{{SCOPE}}})",
                 "{{namespace}} {{app_kubernetes_io_instance}} used"),
                (f"max by ({INSTALLATION}) (obsq_redis_memory_max_bytes{{{SCOPE}}})",
                 "{{namespace}} {{app_kubernetes_io_instance}} maxmemory"),
            ),
        ),
        graph(
            "Enqueues refused by reason",
            "Tasks the scraped producers asked to enqueue that were not written: duplicate, "
            "too_large, invalid, out_of_memory (Redis above the producers' share), "
            "permission_denied, redis_error. Producers scraped without the installation's "
            "labels count in its queues.",
            "ops",
            queries((produced("obsq_tasks_refused_total", 'queue=~"$queue", task=~"$task"',
                              "reason, queue, task"),
                     "{{reason}} {{queue}} {{task}}")),
            bars=True,
        ),
        graph(
            "Age of the queue gauges",
            "Seconds since the queue-wide gauges were last read from Redis, and 1 while the "
            "last read worked: a failed read is served from the one before, for 30 s.",
            "s",
            queries(
                (f"time() - max by ({INSTALLATION}) "
                 f"(obsq_queue_gauges_read_timestamp_seconds{{{SCOPE}}})",
                 "{{namespace}} {{app_kubernetes_io_instance}} age"),
                (f"min by ({INSTALLATION}) (obsq_queue_gauges_read_ok{{{SCOPE}}})",
                 "{{namespace}} {{app_kubernetes_io_instance}} last read ok"),
            ),
            width=24,
        ),
    ]:
        board = board.with_panel(panel)

    board = board.with_row(row("Scheduler"))
    board = board.with_panel(
        graph(
            "Schedule fires and missed fires",
            "Tasks enqueued by obsq scheduler per interval, by schedule entry (fired), and "
            "the fires it did not enqueue because no scheduler ran at their time, as the "
            'missed policy of their entry says (missed: all of them with missed="skip", '
            'all but the latest with missed="once"). obsq schedules lists the entries.',
            "short",
            queries(
                (
                    f"sum by (entry) (increase(obsq_scheduler_fires_total{{{SCOPE}}}[{RATE}]))",
                    "fired {{entry}}",
                ),
                (
                    f"sum by (entry) (increase(obsq_scheduler_missed_total{{{SCOPE}}}[{RATE}]))",
                    "missed {{entry}}",
                ),
            ),
            width=24,
            bars=True,
        )
    )

    board = board.with_row(row("Groups and events"))
    for panel in [
        graph(
            "Grouped tasks waiting",
            "Tasks enqueued with a group that wait for their aggregator (app.aggregate), per "
            "queue. A level that only grows means no worker of the App runs the aggregator "
            "of their type in that queue.",
            "short",
            queries(
                (
                    per_installation("obsq_queue_depth", f'{qsel}, state="aggregating"', "queue"),
                    "{{queue}}",
                )
            ),
            width=8,
        ),
        graph(
            "Aggregations by outcome",
            "Aggregator runs per interval, by queue and aggregator pattern: success (one task "
            "enqueued for the batch) or failed (the aggregator raised or returned junk; the "
            "batch keeps its tasks and is tried again after a backoff).",
            "short",
            queries(
                (
                    f"sum by (queue, task, outcome) "
                    f"(increase(obsq_aggregations_total{{{qsel}}}[{RATE}]))",
                    "{{queue}} {{task}} {{outcome}}",
                )
            ),
            width=8,
            bars=True,
        ),
        graph(
            "Event deliveries by subscriber",
            "Attempts of the copies of published events per interval, by event, subscriber "
            "and outcome: each subscriber's copy has its own retries and dead-letter entry.",
            "short",
            queries(
                (
                    f"sum by (event, subscriber, outcome) "
                    f"(increase(obsq_event_deliveries_total{{{SCOPE}}}[{RATE}]))",
                    "{{event}} {{subscriber}} {{outcome}}",
                )
            ),
            width=8,
            bars=True,
        ),
    ]:
        board = board.with_panel(panel)

    board = board.with_row(row("Outbox"))
    for panel in [
        graph(
            "Outbox rows waiting",
            "Committed rows of each transactional outbox table not yet moved to Redis, as the "
            "leading relay counts them. A level that only grows: the relay is down or fails "
            "(its log and /readyz say why).",
            "short",
            queries((f"max by ({INSTALLATION}, table) "
                     f"(obsq_outbox_rows_waiting{{{SCOPE}}})", "{{table}}")),
            width=8,
        ),
        graph(
            "Oldest outbox row",
            "Age of the oldest committed row waiting for the relay: the time from commit to "
            "Redis. ObsqOutboxRelayStuck fires above 2 minutes.",
            "s",
            queries((f"max by ({INSTALLATION}, table) "
                     f"(obsq_outbox_oldest_age_seconds{{{SCOPE}}})", "{{table}}")),
            width=8,
        ),
        graph(
            "Outbox rows relayed",
            "Rows moved from each outbox table to Redis per second, by all relays.",
            "ops",
            queries((rate("obsq_outbox_relayed_total", SCOPE, "table"), "{{table}}")),
            width=8,
        ),
    ]:
        board = board.with_panel(panel)
    return board


# --- per-task drill-down ----------------------------------------------------------------


def task() -> dash.Dashboard:
    sel = f'{SCOPE}, queue=~"$queue", task=~"$task"'
    qsel = f'{SCOPE}, queue=~"$queue"'
    board = base(
        "obsq-task",
        "obsq / Task",
        "One obsq task type: throughput, failures, retries, duration and wait.",
    ).with_variable(datasource_variable())
    for variable in installation_variables():
        board = board.with_variable(variable)
    board = board.with_variable(
        query_variable(
            "task",
            "Task",
            f"label_values(obsq_tasks_processed_total{{{SCOPE}}}, task)",
            include_all=False,
            multi=False,
        )
    ).with_variable(
        query_variable(
            "queue",
            "Queue",
            f'label_values(obsq_tasks_processed_total{{{SCOPE}, task=~"$task"}}, queue)',
        )
    )

    board = board.with_row(row("Summary"))
    for panel in [
        single(
            "Throughput",
            "Handler runs of this task finished per second, all outcomes.",
            "ops",
            f"sum(rate(obsq_tasks_processed_total{{{sel}}}[{RATE}]))",
            [(None, "blue")],
            width=6,
        ),
        single(
            "Failure ratio",
            'Share of handler runs of this task that failed (outcome=~"retry|dead").',
            "percentunit",
            failure_ratio(sel),
            [(None, "green"), (0.05, "orange"), (0.1, "red")],
            width=6,
        ),
        single(
            "Duration p95",
            "95th percentile of the handler run time.",
            "s",
            histogram_quantiles("obsq_task_duration_seconds", sel)[1][0],
            [(None, "green")],
            width=6,
        ),
        single(
            "Wait p95",
            "95th percentile of the time from due to start.",
            "s",
            histogram_quantiles("obsq_task_wait_seconds", sel)[1][0],
            [(None, "green"), (60, "orange"), (300, "red")],
            width=6,
        ),
    ]:
        board = board.with_panel(panel)

    for title, panels in task_panels(sel):
        board = board.with_row(row(title))
        for panel in panels:
            board = board.with_panel(panel)

    board = board.with_row(row("Execution"))
    for panel in [
        graph(
            "In progress",
            "Runs of this task in progress now, per queue.",
            "short",
            queries((f"sum by (queue) (obsq_tasks_in_progress{{{sel}}})", "{{queue}}")),
            width=8,
        ),
        graph(
            "Mean duration",
            "Mean handler run time (sum / count of the duration histogram).",
            "s",
            queries(
                (
                    f"sum(rate(obsq_task_duration_seconds_sum{{{sel}}}[{RATE}]))\n/\n"
                    f"sum(rate(obsq_task_duration_seconds_count{{{sel}}}[{RATE}]))",
                    "mean",
                )
            ),
            width=8,
        ),
        graph(
            "Queue latency",
            "Age of the oldest pending task in the queues this task runs on.",
            "s",
            queries((f"max by (queue) (obsq_queue_latency_seconds{{{qsel}}})", "{{queue}}")),
            width=8,
        ),
    ]:
        board = board.with_panel(panel)
    return board


DASHBOARDS = {"obsq-overview.json": overview, "obsq-task.json": task}


def render(build) -> str:
    """The dashboard as stable, pretty JSON text with a trailing newline."""
    board = build().build()
    for number, panel in enumerate(board.panels or [], start=1):
        panel.id_val = number  # Grafana wants unique panel ids; the builder leaves them unset
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (out / name).write_text(render(build), encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
