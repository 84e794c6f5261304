"""Two installations in one Prometheus, as the chart renders them: a real Prometheus scrapes
two `obsq worker` processes and an `obsq exporter` started with the rendered commands and
environment, each target labelled as the chart's ServiceMonitor labels it (the namespace and
the pod labels it names in podTargetLabels), and a plain `obsq worker` of a second
installation outside the chart. The queue-wide gauges come from one place per installation,
and the dashboards' queries count each installation once, selected alone or all together.
The rendered `helm test` Pod's check passes against a rendered worker."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from deploytools import CRD_APIS, ROOT, find_tool, helm_template
from observability.helpers import (
    PrometheusServer,
    missing_tool,
    parse,
    pick,
    prometheus_binary,
    scrape,
    wait_ready,
)
from promql import dashboard_queries
from support import ObsqProcess, obsq_env, wait_until

import obsq
from obsq.redis_server import free_port

OVERVIEW = ROOT / "dashboards" / "obsq-overview.json"
QUEUE_GAUGES = ("obsq_queue_depth", "obsq_queue_latency_seconds", "obsq_queue_paused",
                "obsq_workers")
CONCURRENCY = 3
WAITING = 7  # tasks left pending in a queue no worker serves


def rendered(render: Any, suffix: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(args, plain OBSQ_ environment, Prometheus target labels) of a rendered Deployment's
    pod, its target labels as the ServiceMonitor makes them: `namespace`, and each pod label
    of podTargetLabels under Prometheus's name for it."""
    deployment = render.one("Deployment", suffix)
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]
           if "value" in e and e["name"].startswith("OBSQ_")}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    labels = {"namespace": deployment["metadata"]["namespace"]}
    for name in render.one("ServiceMonitor")["spec"]["podTargetLabels"]:
        labels[re.sub(r"[^a-zA-Z0-9_]", "_", name)] = pod_labels[name]
    return c["args"], env, labels


def panel_query(title: str, values: dict[str, str], metric: str = "") -> str:
    """The query of the Overview's panels titled `title` (reading `metric`)."""
    (expr,) = {e for t, e in dashboard_queries(OVERVIEW, values) if t == title and metric in e}
    return expr


async def test_each_installation_publishes_its_queue_gauges_once(
        redis_url: str, namespace: str, tmp_path: Path) -> None:
    helm = find_tool("helm")  # one helm is enough: the chart tests render with both
    binary = prometheus_binary()
    if binary is None:
        missing_tool("prometheus is not on PATH (apt-get install prometheus)")
    served, other = f"work-{namespace}", f"{namespace}-billing"
    (tmp_path / "installed.py").write_text(
        "import obsq\n\n"
        f"app = obsq.App(namespace={namespace!r})\n\n\n"
        f'@app.task("job", queue={served!r})\n'
        "async def job(task):\n"
        "    return None\n")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "app": "installed:app",
        "obsq": {"namespace": namespace, "logFormat": "text"},
        "redis": {"url": redis_url},
        "worker": {"concurrency": CONCURRENCY, "queues": [{"name": served, "weight": 1}]},
        "metrics": {"serviceMonitor": {"enabled": True}},
    }))
    render = helm_template(helm, "-f", str(values), *[f"--api-versions={a}" for a in CRD_APIS])
    worker_args, worker_env, worker_labels = rendered(render, "-worker")
    exporter_args, exporter_env, exporter_labels = rendered(render, "-exporter")
    assert worker_env["OBSQ_QUEUE_METRICS"] == "false"
    assert worker_labels == {"namespace": "jobs", "app_kubernetes_io_part_of": "obsq",
                             "app_kubernetes_io_instance": "jobs",
                             "app_kubernetes_io_component": "worker"}

    processes: list[ObsqProcess] = []

    def start(args: list[str], env: dict[str, str], name: str) -> int:
        """The process on a port of its own (in a cluster each pod has its own IP)."""
        port = free_port()
        processes.append(ObsqProcess(args, obsq_env(**{**env, "OBSQ_HTTP_PORT": str(port)}),
                                     tmp_path, tmp_path / f"{name}.log"))
        return port

    client = obsq.Client(redis_url, namespace=namespace)
    prom: PrometheusServer | None = None
    try:
        workers = [start(worker_args, worker_env, f"worker-{i}") for i in range(2)]
        exporter = start(exporter_args, exporter_env, "exporter")
        # A second installation outside the chart: a plain `obsq worker`, which keeps the
        # queue gauges, in its own key namespace, scraped with a namespace label only.
        plain = start(["worker", "installed:app", "--concurrency", "1"],
                      {"OBSQ_NAMESPACE": other, "OBSQ_QUEUES": served}, "plain")
        for port in [*workers, exporter, plain]:
            await wait_ready(port, timeout=60)

        for _ in range(4):
            await client.enqueue("job", queue=served)
        for _ in range(WAITING):
            await client.enqueue("job", queue=f"waiting-{namespace}")

        # What each process serves: the queue gauges from the exporter and the plain
        # worker only.
        samples = {port: parse(await asyncio.to_thread(scrape, port))
                   for port in [*workers, exporter, plain]}
        for port in workers:
            assert not [g for g in QUEUE_GAUGES if pick(samples[port], g)], port
            assert pick(samples[port], "obsq_worker_concurrency")
        for port in (exporter, plain):
            assert all(pick(samples[port], g) for g in QUEUE_GAUGES), port

        # The rendered `helm test` Pod's check, against a rendered worker.
        (check,) = render.one("Pod", "-test")["spec"]["containers"]
        assert check["command"] == ["python", "-c"]
        script, url = check["args"]
        assert url.endswith(f":{render.one('Service', '-metrics')['spec']['ports'][0]['port']}"
                            "/readyz")
        answered = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", script,
                             f"http://127.0.0.1:{workers[0]}/readyz"],
            capture_output=True, text=True, timeout=120)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert " 200 " in answered.stdout

        prom = await asyncio.to_thread(
            PrometheusServer, binary, tmp_path / "prometheus",
            [f"127.0.0.1:{p}" for p in workers], labels=worker_labels,
            static_configs=[
                {"targets": [f"127.0.0.1:{exporter}"], "labels": exporter_labels},
                {"targets": [f"127.0.0.1:{plain}"], "labels": {"namespace": "billing"}},
            ])
        await prom.wait_for('sum(up{app_kubernetes_io_instance="jobs"}) == 3 '
                            'and on () sum(up{namespace="billing"}) == 1', timeout=60)
        await prom.wait_for(
            f'sum(obsq_tasks_processed_total{{namespace="jobs", queue="{served}"}}) == 4',
            timeout=30)
        await prom.wait_for("count(obsq_workers) == 2", timeout=30)
        # One publisher per installation.
        assert prom.values("count by (namespace, app_kubernetes_io_instance) (obsq_workers)",
                           "namespace", "app_kubernetes_io_instance") == {
            ("jobs", "jobs"): 1, ("billing", ""): 1}

        def numbers(title: str, values: dict[str, str], *labels: str, metric: str = ""
                    ) -> dict[tuple[str, ...], float]:
            query = panel_query(title, {**values, "__rate_interval": "15s"}, metric)
            return prom.values(query, *labels)

        jobs = {"namespace": "jobs", "installation": "jobs"}
        everything = {"namespace": ".*", "installation": ".*"}
        alone_waiting = {**jobs, "queue": f"waiting-{namespace}"}

        async def counted(title: str, values: dict[str, str], expected: float) -> None:
            async def right() -> bool:
                got = await asyncio.to_thread(numbers, title, values)
                return got == {(): expected}
            await wait_until(right, timeout=20, what=f"{title} with {values} == {expected}")

        # Live workers: the chart's two, then the plain worker's one added, not doubled
        # and not hidden behind a max.
        await counted("Live workers", jobs, 2)
        await counted("Live workers", everything, 3)
        assert numbers("In progress vs concurrency", jobs,
                       metric="obsq_worker_concurrency") == {(): 2 * CONCURRENCY}
        depth = numbers("Queue depth by state", alone_waiting, "queue", "state")
        assert depth[(f"waiting-{namespace}", "pending")] == WAITING
        assert len(depth) == 8  # one series per state, each counted once
        assert numbers("Dead tasks", {**jobs, "queue": ".*"}) == {(): 0}
    finally:
        await client.close()
        if prom is not None:
            await asyncio.to_thread(prom.close)
        for process in processes:
            code = await asyncio.to_thread(process.stop)
            process.close()
            assert code == 0, process.log_path.read_text()
