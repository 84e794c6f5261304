"""The alert rules and the Grafana dashboards: promtool checks and unit tests, the
dashboards regenerated from code, and every query held to the metric names of the
observability contract (DESIGN.md, section 4)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploytools import ROOT, missing, run
from promql import (
    CONTRACT_METRICS,
    alert_queries,
    dashboard_queries,
    metric_names,
    substitute,
    unknown_metrics,
    variable_queries,
)

RULES = ROOT / "alerts" / "obsq.rules.yml"
RULE_TESTS = ROOT / "alerts" / "obsq.rules.test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
DOCS_SITE = yaml.safe_load((ROOT / "deploy" / "helm" / "obsq" / "Chart.yaml").read_text())["home"]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
DASHBOARD_IDS = [p.name for p in DASHBOARDS]
ALERTS = {
    "ObsqQueueLatencyHigh",
    "ObsqDeadTasksGrowing",
    "ObsqNoLiveWorkers",
    "ObsqLeaseRecoveriesSpiking",
    "ObsqHighFailureRatio",
    "ObsqRedisErrors",
    "ObsqRedisMayEvictTasks",
    "ObsqRedisMemoryHigh",
    "ObsqAggregatorFailing",
    "ObsqWorkersDown",
    "ObsqWorkersAbsent",
    "ObsqSchedulerDown",
    "ObsqExporterDown",
    "ObsqSchedulerMissedFires",
    "ObsqOutboxRelayStuck",
    "ObsqQueueGaugesUnreadable",
    "ObsqSlotsStuck",
    "ObsqEventLoopBlocked",
}
# The labels of one installation: the Kubernetes namespace and the Helm release, as the
# chart's ServiceMonitor and PodMonitor put them on every target.
INSTALLATION = ("namespace", "app_kubernetes_io_instance")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# --- alert rules ------------------------------------------------------------------------


def test_promtool_check_rules(promtool: str) -> None:
    proc = run([promtool, "check", "rules", str(RULES)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_promtool_test_rules(promtool: str) -> None:
    proc = run([promtool, "test", "rules", str(RULE_TESTS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rule_tests_fire_every_alert_and_check_a_healthy_system() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == ALERTS
    quiet = [
        test
        for test in tests
        if {c["alertname"] for c in test["alert_rule_test"]} == ALERTS
        and not any(c.get("exp_alerts") for c in test["alert_rule_test"])
    ]
    assert quiet, "no test checks that a healthy system fires no alert"


def test_alerts_have_severity_annotations_and_a_runbook_section() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"]
        url = annotations["runbook_url"]  # absolute: its page on the documentation site
        assert url.startswith(f"{DOCS_SITE}runbook.html#"), url
        assert url.split("#", 1)[1] in headings, f"{url}: no such section in docs/runbook.md"


def test_alerts_aggregate_queue_gauges_with_max() -> None:
    # Exporter replicas (and workers outside the chart) export the same queue-wide gauges:
    # summing them would multiply by their number.
    for name, expr in alert_queries(RULES):
        for gauge in ("obsq_queue_depth", "obsq_queue_latency_seconds", "obsq_workers"):
            for match in re.finditer(rf"(\w+)\s*by\s*\([^)]*\)\s*\(\s*{gauge}\b", expr):
                assert match.group(1) == "max", f"{name}: {match.group(0)}"


def test_alerts_group_by_installation() -> None:
    # Two installations in one Prometheus (or one namespace) never mix: every aggregation
    # of every alert keeps the namespace and the Helm release.
    for name, expr in alert_queries(RULES):
        groupings = re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr)
        assert groupings, f"{name} does not group: {expr}"
        for grouping in groupings:
            labels = [label.strip() for label in grouping.split(",")]
            assert labels[:2] == list(INSTALLATION), f"{name}: {grouping}"


def test_up_rules_select_obsq_pods_by_component() -> None:
    ups = {name: expr for name, expr in alert_queries(RULES) if "up{" in expr}
    assert set(ups) == {"ObsqWorkersDown", "ObsqWorkersAbsent", "ObsqSchedulerDown",
                        "ObsqExporterDown"}
    ups.pop("ObsqWorkersAbsent")  # the exporter's and the workers' targets
    for name, expr in ups.items():
        component = name.removeprefix("Obsq").removesuffix("Down").removesuffix("s").lower()
        assert (f'up{{app_kubernetes_io_part_of="obsq", '
                f'app_kubernetes_io_component="{component}"}}') in expr, expr


# --- dashboards -------------------------------------------------------------------------


def test_dashboards_are_up_to_date_with_the_generator(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):  # what CI runs on newer Pythons checks the dashboards
        pytest.skip("every release of grafana-foundation-sdk needs Python 3.11 or newer")
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        missing("grafana-foundation-sdk is not installed (pip install --group test)")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "generate.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    generated = {p.name: p.read_bytes() for p in sorted(tmp_path.glob("*.json"))}
    committed = {p.name: p.read_bytes() for p in DASHBOARDS}
    assert generated.keys() == committed.keys()
    for name in generated:
        assert generated[name] == committed[name], (
            f"dashboards/{name} is stale: run `python dashboards/generate.py`"
        )


@pytest.mark.parametrize("path", DASHBOARDS, ids=DASHBOARD_IDS)
def test_dashboard_structure(path: Path) -> None:
    board = load(path)
    assert board["schemaVersion"] >= 39  # Grafana 11
    assert board["uid"] == path.stem
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "installation", "queue", "task"):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"].startswith("label_values(")
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


SCOPE = ('namespace=~"$namespace"', 'app_kubernetes_io_instance=~"$installation"')
# Producers scraped under a job of their own lack the installation's labels: their series
# count when they carry the installation or none, in the installation's queues.
PRODUCER_COUNTERS = {"obsq_tasks_enqueued_total", "obsq_tasks_refused_total"}
PRODUCER_SCOPE = 'app_kubernetes_io_instance=~"$installation|"'
IN_THE_INSTALLATIONS_QUEUES = re.compile(
    r"\nand on \(queue\)\nmax by \(namespace, app_kubernetes_io_instance, queue\) "
    r"\(obsq_queue_depth\{([^}]*)\}\)$")


@pytest.mark.parametrize("path", DASHBOARDS, ids=DASHBOARD_IDS)
def test_every_dashboard_query_is_scoped_by_namespace_and_installation(path: Path) -> None:
    board = load(path)
    targets = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    variables = [v["query"] for v in board["templating"]["list"] if v["name"] in ("queue", "task")]
    for expr in targets + variables:
        for metric in re.finditer(r"obsq_\w+", expr):
            selector = re.match(r"\{([^}]*)\}", expr[metric.end():])
            assert selector, f"{metric.group(0)} without a selector: {expr}"
            if metric.group(0) in PRODUCER_COUNTERS:
                assert PRODUCER_SCOPE in selector.group(1), expr
                queues = IN_THE_INSTALLATIONS_QUEUES.search(expr)
                assert queues and all(m in queues.group(1) for m in SCOPE), expr
            else:
                assert all(m in selector.group(1) for m in SCOPE), expr
    (installation,) = [v for v in board["templating"]["list"] if v["name"] == "installation"]
    assert installation["query"].endswith(", app_kubernetes_io_instance)")
    assert 'namespace=~"$namespace"' in installation["query"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=DASHBOARD_IDS)
def test_queue_gauges_count_each_installation_once(path: Path) -> None:
    # An installation's exporter replicas report the same values: max per installation,
    # then a sum over the selected ones (max alone would hide all but one installation).
    for title, expr in dashboard_queries(path):
        for gauge in ("obsq_queue_depth", "obsq_workers"):
            for match in re.finditer(rf"(\w+)\s*by\s*\(([^)]*)\)\s*\(\s*{gauge}\b", expr):
                assert match.group(1) == "max", f"{title}: {expr}"
                assert match.group(2).startswith(", ".join(INSTALLATION)), f"{title}: {expr}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=DASHBOARD_IDS)
def test_latency_panels_show_exemplars(path: Path) -> None:
    graphs = [p for p in load(path)["panels"] if p["type"] == "timeseries"
              and any("histogram_quantile" in t["expr"] for t in p["targets"])]
    assert {p["title"] for p in graphs} >= {"Task duration p50 / p95 / p99",
                                            "Task wait p50 / p95 / p99"}
    for panel in graphs:
        assert all(t.get("exemplar") is True for t in panel["targets"]), panel["title"]


def test_overview_has_the_panels_operators_need() -> None:
    titles = {p["title"] for p in load(ROOT / "dashboards" / "obsq-overview.json")["panels"]}
    for wanted in (
        "Throughput by outcome",
        "Failure ratio",
        "Queue depth by state",
        "Queue latency",
        "In progress vs concurrency",
        "Task duration p50 / p95 / p99",
        "Task wait p50 / p95 / p99",
        "Retries, dead and expired tasks",
        "Dead-letter sets",
        "Lease recoveries by reason",
        "Live workers",
        "Redis errors by operation",
        "Paused queues",
        "Schedule fires and missed fires",
    ):
        assert wanted in titles


def test_task_dashboard_filters_every_task_query_by_task() -> None:
    path = ROOT / "dashboards" / "obsq-task.json"
    task_labelled = {
        "obsq_tasks_enqueued_total",
        "obsq_tasks_processed_total",
        "obsq_task_duration_seconds",
        "obsq_task_wait_seconds",
        "obsq_tasks_in_progress",
    }
    board = load(path)
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for metric, selector in re.findall(r"(obsq_\w+)\{([^}]*)\}", target["expr"]):
                if metric_names(metric) & task_labelled:
                    assert 'task=~"$task"' in selector, f"{panel['title']}: {target['expr']}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["task"]["includeAll"] is False  # a drill-down shows one task


def test_failures_are_retry_or_dead() -> None:
    for path in [*DASHBOARDS]:
        for title, expr in dashboard_queries(path):
            if "Failure" in title:
                assert 'outcome=~"retry|dead"' in expr


# --- every query uses only the contract's metric names ----------------------------------


def all_queries() -> list[tuple[str, str]]:
    found = []
    for path in DASHBOARDS:
        found += [(f"{path.name}: {t}", e) for t, e in dashboard_queries(path)]
        found += [(f"{path.name}: ${n}", q) for n, q in variable_queries(path)]
    found += [(f"{RULES.name}: {n}", e) for n, e in alert_queries(RULES)]
    return found


@pytest.mark.parametrize(("where", "expr"), all_queries(), ids=lambda v: str(v)[:60])
def test_query_uses_only_contract_metrics(where: str, expr: str) -> None:
    assert metric_names(expr) or re.search(r"\bup\{", expr), f"{where} uses no obsq metric"
    assert unknown_metrics(expr) == set(), f"{where}: {expr}"


def test_every_contract_metric_is_on_a_dashboard() -> None:
    used = set().union(*(metric_names(expr) for _, expr in all_queries()))
    assert used == CONTRACT_METRICS


def test_dashboard_queries_parse_as_promql(promtool: str, tmp_path: Path) -> None:
    # promtool parses every expression of a rules file: wrap each query (variables
    # substituted as promql.py does for the end-to-end test) in a recording rule.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(q for path in DASHBOARDS for q in dashboard_queries(path))
    ]
    assert len(rules) > 20
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the helpers of promql.py -----------------------------------------------------------


def test_substitute_grafana_variables() -> None:
    expr = (
        'sum(rate(obsq_tasks_processed_total{queue=~"$queue", task=~"${task}"}[$__rate_interval]))'
    )
    assert substitute(expr) == (
        'sum(rate(obsq_tasks_processed_total{queue=~".*", task=~".*"}[1m]))'
    )
    assert substitute('x{queue=~"[[queue]]"}', {"queue": "default"}) == 'x{queue=~"default"}'
    assert substitute("rate(x[$__rate_interval])", {"__rate_interval": "15s"}) == "rate(x[15s])"


def test_metric_names_fold_histogram_series_only() -> None:
    assert metric_names("obsq_task_wait_seconds_bucket + obsq_task_duration_seconds_count") == {
        "obsq_task_wait_seconds",
        "obsq_task_duration_seconds",
    }
    assert unknown_metrics("obsq_workers_count") == {"obsq_workers_count"}
    assert unknown_metrics("obsq_queue_size") == {"obsq_queue_size"}
    assert unknown_metrics("max(obsq_workers)") == set()


def overview_query(title: str) -> str:
    """The one query of an overview panel, scoped to installation `jobs` of namespace
    `jobs`, every queue and task."""
    (expr,) = [e for t, e in dashboard_queries(
        ROOT / "dashboards" / "obsq-overview.json",
        {"namespace": "jobs", "installation": "jobs"}) if t == title]
    return expr


def test_dashboard_queries_count_under_promtool(promtool: str, tmp_path: Path) -> None:
    # Two exporter replicas of installation jobs report 3 dead tasks in queue a and 7 in b,
    # beside another installation's 100; a web app scraped under its own job (no
    # installation labels) enqueues into a and into another installation's queue c, and a
    # producer labelled with that other installation enqueues into a.
    jobs = 'namespace="jobs", app_kubernetes_io_instance="jobs"'
    series = [
        *[(f'obsq_queue_depth{{{jobs}, pod="{pod}", queue="{q}", state="{state}"}}', v)
          for pod in ("exporter-1", "exporter-2")
          for q, state, v in [("a", "dead", "3x20"), ("b", "dead", "7x20"),
                              ("a", "pending", "0x20"), ("b", "pending", "0x20")]],
        ('obsq_queue_depth{namespace="jobs", app_kubernetes_io_instance="other", '
         'queue="c", state="dead"}', "100x20"),
        ('obsq_tasks_enqueued_total{job="web", queue="a", task="x"}', "0+15x20"),
        ('obsq_tasks_enqueued_total{job="web", queue="c", task="x"}', "0+15x20"),
        ('obsq_tasks_enqueued_total{job="other", app_kubernetes_io_instance="other", '
         'queue="a", task="x"}', "0+15x20"),
        (f'obsq_tasks_enqueued_total{{{jobs}, job="obsq", queue="b", task="y"}}', "0+30x20"),
    ]
    cases = [
        {"expr": overview_query("Dead tasks"), "eval_time": "4m",
         "exp_samples": [{"labels": "{}", "value": 10}]},
        {"expr": overview_query("Enqueued"), "eval_time": "4m",
         "exp_samples": [{"labels": '{queue="a", task="x"}', "value": 1},
                         {"labels": '{queue="b", task="y"}', "value": 2}]},
    ]
    tests = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": cases,
    }]}
    path = tmp_path / "dashboard-queries.test.yml"
    path.write_text(yaml.safe_dump(tests))
    proc = run([promtool, "test", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
