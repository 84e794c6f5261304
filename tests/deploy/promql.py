"""The PromQL of the dashboards and the alert rules, ready to send to a real Prometheus.

    dashboard_queries("dashboards/obsq-overview.json") -> [(panel title, expr), ...]
    alert_queries("alerts/obsq.rules.yml")             -> [(alert name, expr), ...]

Grafana template variables are replaced by values that Prometheus accepts and that
match everything: the dashboards use their variables only in regex matchers
(queue=~"$queue"), so `$queue` becomes `.*`; `$__rate_interval` and friends become
fixed durations. An end-to-end test can run each query against a Prometheus that
scrapes a real worker and expect data.

`metric_names(expr)` and `unknown_metrics(expr)` check an expression against the
observability contract (DESIGN.md, section 4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

# DESIGN.md, section 4: the only metric names that dashboards and alerts may use.
CONTRACT_METRICS = frozenset(
    {
        "obsq_tasks_enqueued_total",
        "obsq_tasks_refused_total",
        "obsq_tasks_processed_total",
        "obsq_task_duration_seconds",
        "obsq_task_wait_seconds",
        "obsq_tasks_in_progress",
        "obsq_worker_concurrency",
        "obsq_worker_stuck_slots",
        "obsq_worker_event_loop_lag_seconds",
        "obsq_worker_fetch_stalled_seconds",
        "obsq_redis_data_lost_total",
        "obsq_lease_recoveries_total",
        "obsq_tasks_unknown_type_total",
        "obsq_queue_depth",
        "obsq_queue_latency_seconds",
        "obsq_queue_paused",
        "obsq_queue_partitions",
        "obsq_queue_fairness_keys",
        "obsq_queue_fairness_key_waiting",
        "obsq_workers",
        "obsq_redis_maxmemory_policy_ok",
        "obsq_redis_memory_used_bytes",
        "obsq_redis_memory_max_bytes",
        "obsq_queue_gauges_read_ok",
        "obsq_queue_gauges_read_timestamp_seconds",
        "obsq_redis_errors_total",
        "obsq_build_info",
        "obsq_scheduler_fires_total",
        "obsq_scheduler_missed_total",
        "obsq_tasks_throttled_total",
        "obsq_aggregations_total",
        "obsq_event_deliveries_total",
        "obsq_outbox_rows_waiting",
        "obsq_outbox_oldest_age_seconds",
        "obsq_outbox_relayed_total",
    }
)
HISTOGRAMS = frozenset({"obsq_task_duration_seconds", "obsq_task_wait_seconds"})
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")
METRIC = re.compile(r"obsq_[a-z_]+")

# Grafana's built-in interval variables, with the values a test should use.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "60000",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace Grafana variables by `values`, else built-in intervals by the durations of
    BUILTINS, else by `.*` (which matches every label value in a `=~` matcher)."""
    values = values or {}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name in values:
            return values[name]
        return BUILTINS.get(name, ".*")

    return VARIABLE.sub(replace, expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # panels of a collapsed row


def dashboard_queries(
    path: str | Path, values: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of every panel, variables substituted."""
    board = json.loads(Path(path).read_text(encoding="utf-8"))
    queries = []
    for panel in _panels(board.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                queries.append((panel.get("title", ""), substitute(target["expr"], values)))
    return queries


def variable_queries(path: str | Path) -> list[tuple[str, str]]:
    """(variable name, query) of the dashboard's query variables, e.g. label_values(...)."""
    board = json.loads(Path(path).read_text(encoding="utf-8"))
    found = []
    for variable in (board.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        found.append((variable["name"], query or ""))
    return found


def alert_queries(path: str | Path) -> list[tuple[str, str]]:
    """(alert or recording rule name, PromQL) for every rule of a Prometheus rules file."""
    rules_file = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return [
        (rule.get("alert") or rule.get("record"), rule["expr"].strip())
        for group in rules_file.get("groups") or []
        for rule in group.get("rules") or []
    ]


def metric_names(expr: str) -> set[str]:
    """The obsq metric names in an expression, histogram series folded to their family."""
    names = set()
    for name in METRIC.findall(expr):
        base = HISTOGRAM_SUFFIX.sub("", name)
        names.add(base if base in HISTOGRAMS else name)
    return names


def unknown_metrics(expr: str) -> set[str]:
    """Metric names in `expr` that the observability contract does not define."""
    return metric_names(expr) - CONTRACT_METRICS
