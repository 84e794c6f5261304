"""The Helm chart, checked with the real helm 4 and helm 3 binaries, kubernetes-validate
and promtool. Every scenario of conftest.SCENARIOS is rendered once per helm."""

from __future__ import annotations

import json
import re
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploytools import (
    CHART,
    CRD_APIS,
    HERE,
    ROOT,
    SCENARIOS,
    Render,
    find_tool,
    helm_template,
    run,
)
from promql import unknown_metrics
from rendered import container
from support import ObsqProcess, obsq_env, wait_for

from obsq.settings import WorkerSettings

API_FLAGS = [f"--api-versions={a}" for a in CRD_APIS]
HOME = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]  # the documentation site


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value (or valueFrom) of a container's environment."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def admitted_namespaces(render: Render, pod_labels: dict[str, str], port: str
                        ) -> dict[str, str]:
    """The labels of the namespaces the NetworkPolicy, which must select the pods with
    `pod_labels`, lets through to their `port`."""
    policy = render.one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (rule,) = [r for r in policy["ingress"] if r["ports"][0]["port"] == port]
    return rule["from"][0]["namespaceSelector"]["matchLabels"]


# --- lint and render ------------------------------------------------------------------


@pytest.mark.parametrize("scenario_name", sorted(SCENARIOS))
def test_helm_lint_strict(helm: str, scenario_name: str) -> None:
    # helm lint has no --api-versions: the CRD-gated objects are skipped there, and
    # rendered (and validated) by the template tests below.
    args = [a for a in SCENARIOS[scenario_name] if not a.startswith("--api-versions")]
    proc = run([helm, "lint", "--strict", str(CHART), *args])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


# The exporter (a Deployment and its Service) runs by default; the Pod is the `helm test`
# hook.
DEFAULT_KINDS = ["Deployment", "Deployment", "Pod", "PodDisruptionBudget", "Service",
                 "Service", "ServiceAccount"]
EXPECTED_KINDS = {
    "default": DEFAULT_KINDS,
    "minimal-example": DEFAULT_KINDS,
    "all-keda": [
        "ConfigMap",
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "NetworkPolicy",
        "Pod",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "ScaledObject",
        "Service",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "all-hpa": [
        "ConfigMap",
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "Pod",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
    "production-example": [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "Pod",
        "PodDisruptionBudget",
        "PrometheusRule",
        "ScaledObject",
        "Service",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ],
}


def test_template_renders_expected_objects(rendered: Render, scenario: str) -> None:
    assert rendered.kinds() == EXPECTED_KINDS[scenario]
    for doc in rendered.docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "obsq"
        assert labels["app.kubernetes.io/instance"] == "jobs"


def test_rendered_objects_pass_kubernetes_validate(
    rendered: Render, kubernetes_validate: list[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered.stdout)
    proc = run([*kubernetes_validate, "--strict", "-k", "1.30.0", str(manifest)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crds = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}
    checked = [k for k in rendered.kinds() if k not in crds]
    assert proc.stdout.count("passed for resource") == len(checked), proc.stdout


def test_crd_objects_need_the_monitoring_api(helm: str) -> None:
    # Enabled, but the cluster (here: the render) has no monitoring.coreos.com/v1.
    render = helm_template(helm, "-f", str(HERE / "values-all.yaml"))
    assert "ServiceMonitor" not in render.kinds()
    assert "PrometheusRule" not in render.kinds()
    with_api = helm_template(helm, "-f", str(HERE / "values-all.yaml"), *API_FLAGS)
    assert {"ServiceMonitor", "PrometheusRule"} <= set(with_api.kinds())


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_monitoring_objects_can_be_forced_without_the_api(
    helm: str, monitor: str, kubernetes_validate: list[str], tmp_path: Path
) -> None:
    # `helm template` with no --api-versions, as Argo CD may run it: forced on, the
    # monitoring objects are rendered all the same, and equal to those rendered with the API.
    values = ["--set", f"metrics.{monitor}.enabled=true,prometheusRule.enabled=true"]
    forced = helm_template(helm, *values, "--set", "prometheusOperator.forceApi=true")
    with_api = helm_template(helm, *values, *API_FLAGS)
    kind = monitor[0].upper() + monitor[1:]
    for name in (kind, "PrometheusRule"):
        assert forced.one(name) == with_api.one(name)
    assert helm_template(helm, *values).all(kind) == []
    manifest = tmp_path / "forced.yaml"
    manifest.write_text(forced.stdout)
    proc = run([*kubernetes_validate, "--strict", "-k", "1.30.0", str(manifest)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_monitors_put_the_installation_on_every_target(helm: str) -> None:
    # ServiceMonitor or PodMonitor: the same pod labels become target labels, and every
    # scraped pod carries them, so dashboards and alerts tell installations apart.
    target_labels = ["app.kubernetes.io/part-of", "app.kubernetes.io/instance",
                     "app.kubernetes.io/component"]
    for monitor, kind in (("serviceMonitor", "ServiceMonitor"), ("podMonitor", "PodMonitor")):
        render = helm_template(helm, "--set", f"metrics.{monitor}.enabled=true,"
                               "scheduler.enabled=true", *API_FLAGS)
        spec = render.one(kind)["spec"]
        assert spec["podTargetLabels"] == target_labels
        assert spec["selector"]["matchExpressions"] == [{
            "key": "app.kubernetes.io/component", "operator": "In",
            "values": ["worker", "scheduler", "exporter"]}]
        for component in ("worker", "scheduler", "exporter"):
            pod = render.one("Deployment", f"-{component}")["spec"]["template"]["metadata"]
            labels = {label: pod["labels"][label] for label in target_labels}
            assert labels == {"app.kubernetes.io/part-of": "obsq",
                              "app.kubernetes.io/instance": "jobs",
                              "app.kubernetes.io/component": component}
            assert spec["selector"]["matchLabels"].items() <= pod["labels"].items()
    pod_monitor = helm_template(helm, "--set", "metrics.podMonitor.enabled=true",
                                *API_FLAGS).one("PodMonitor")["spec"]
    assert pod_monitor["podMetricsEndpoints"][0]["port"] == "http-metrics"
    both = helm_template(helm, "--set", "metrics.podMonitor.enabled=true,"
                         "metrics.serviceMonitor.enabled=true", *API_FLAGS, check=False)
    assert both.returncode != 0 and "enable only one" in both.stderr


# --- the schema -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "bogus=1"], "bogus"),
        (["--set", "worker.bogus=1"], "bogus"),
        (["--set", "metrics.serviceMonitor.bogus=1"], "bogus"),
        (["--set", "worker.startupProbe.bogus=1"], "bogus"),
        (["--set-string", "worker.concurrency=fifty"], "concurrency"),
        (["--set", "worker.shutdownTimeout=true"], "shutdownTimeout"),
        (["--set", "keda.metric=cpu"], "metric"),
        (["--set", r"worker.queues[0].name=a\,b"], "queues"),
        (["--set", "tracing.protocol=udp"], "protocol"),
        (["--set", "worker.pdb.maxUnavailable=half"], "maxUnavailable"),
        (["--set", "exporter.bogus=1"], "bogus"),
        (["--set-string", "exporter.replicaCount=one"], "replicaCount"),
        (["--set", "exporter.enabled=yes"], "enabled"),
        (["--set", "exporter.readinessProbe.periodSeconds=0"], "periodSeconds"),
        (["--set", "scheduler.livenessProbe.bogus=1"], "bogus"),
        (["--set", "ui.bogus=1"], "bogus"),
        (["--set-string", "ui.port=web"], "port"),
        (["--set", "ui.traceUrl=https://grafana.example.com/explore"], "traceUrl"),
        (["--set", "ui.readOnly=yes"], "readOnly"),
    ],
    ids=[
        "unknown-top-level-key",
        "unknown-worker-key",
        "unknown-servicemonitor-key",
        "unknown-probe-key",
        "string-for-integer",
        "boolean-for-integer",
        "keda-metric-enum",
        "queue-name-pattern",
        "otlp-protocol-enum",
        "pdb-int-or-percent",
        "unknown-exporter-key",
        "exporter-string-for-integer",
        "exporter-string-for-boolean",
        "exporter-probe-minimum",
        "unknown-scheduler-probe-key",
        "unknown-ui-key",
        "ui-string-for-port",
        "ui-trace-url-without-trace-id",
        "ui-string-for-boolean",
    ],
)
def test_schema_rejects_bad_values(helm: str, args: list[str], message: str) -> None:
    render = helm_template(helm, *args, check=False)
    assert render.returncode != 0, f"{args} was accepted"
    assert message in render.stderr, render.stderr


def test_hpa_and_keda_are_mutually_exclusive(helm: str) -> None:
    render = helm_template(
        helm, "--set", "autoscaling.enabled=true,keda.enabled=true", *API_FLAGS, check=False
    )
    assert render.returncode != 0
    assert "mutually exclusive" in render.stderr


@pytest.mark.parametrize("component", ["worker", "scheduler", "exporter", "ui"])
def test_pdb_takes_one_of_min_available_and_max_unavailable(helm: str, component: str) -> None:
    render = helm_template(helm, "--set", f"scheduler.enabled=true,ui.enabled=true,"
                           f"{component}.pdb.enabled=true,"
                           f"{component}.pdb.minAvailable=1", check=False)
    assert render.returncode != 0
    assert f"{component}.pdb: set only one of minAvailable and maxUnavailable" in render.stderr


def test_a_pdb_per_component(render_all: Render) -> None:
    worker = render_all.one("PodDisruptionBudget", "-worker")["spec"]
    assert worker["minAvailable"] == "50%" and "maxUnavailable" not in worker
    assert worker["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    scheduler = render_all.one("PodDisruptionBudget", "-scheduler")["spec"]
    assert scheduler["maxUnavailable"] == 1
    assert scheduler["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    exporter = render_all.one("PodDisruptionBudget", "-exporter")["spec"]
    assert exporter["minAvailable"] == 1 and "unhealthyPodEvictionPolicy" not in exporter
    assert {d["metadata"]["name"] for d in render_all.all("PodDisruptionBudget")} == {
        "jobs-obsq-worker", "jobs-obsq-scheduler", "jobs-obsq-exporter"}  # none for the console
    for component, spec in (("worker", worker), ("scheduler", scheduler),
                            ("exporter", exporter)):
        pods = render_all.one("Deployment", f"-{component}")["spec"]["template"]["metadata"]
        assert spec["selector"]["matchLabels"].items() <= pods["labels"].items()


def test_pdbs_only_of_components_that_run(helm: str) -> None:
    render = helm_template(helm, "--set", "scheduler.pdb.enabled=true,ui.pdb.enabled=true")
    assert [d["metadata"]["name"] for d in render.all("PodDisruptionBudget")] == [
        "jobs-obsq-worker"]
    assert "unhealthyPodEvictionPolicy" not in render.one("PodDisruptionBudget")["spec"]


def test_image_registry_goes_in_front_of_the_repository(helm: str, render_all: Render) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    for deployment in render_all.all("Deployment"):
        assert container(deployment)["image"] == f"registry.example.com/shop/worker@{digest}"
    render = helm_template(helm, "--set", "image.registry=registry.example.com:5000/",
                           "--set", "image.tag=1.2.3")
    assert container(render.one("Deployment", "-worker"))["image"] == (
        "registry.example.com:5000/obsq:1.2.3")


def test_worker_doors(render_all: Render) -> None:
    worker = render_all.one("Deployment", "-worker")
    pod = worker["spec"]["template"]["spec"]
    assert worker["spec"]["minReadySeconds"] == 10
    (init,) = pod["initContainers"]
    assert init["name"] == "wait-for-migrations"
    assert init["image"] == "registry.example.com/shop/migrate:1.0.0"  # through tpl
    assert [c["name"] for c in pod["containers"]] == ["worker", "db-proxy"]
    assert container(worker)["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert container(worker)["envFrom"] == [{"configMapRef": {"name": "shop-config"}},
                                            {"secretRef": {"name": "shop-worker-secrets"}}]
    assert pod["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}


@pytest.mark.parametrize("component", ["scheduler", "exporter", "ui"])
def test_doors_of_the_other_components(render_all: Render, component: str) -> None:
    deployment = render_all.one("Deployment", f"-{component}")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert deployment["spec"]["minReadySeconds"] == 5
    assert c["envFrom"] == [{"configMapRef": {"name": "shop-config"}},
                            {"secretRef": {"name": f"shop-{component}-secrets"}}]
    assert {"name": "shop-settings", "mountPath": "/etc/shop", "readOnly": True} in (
        c["volumeMounts"])
    assert {"name": "shop-settings", "configMap": {"name": "shop-settings"}} in pod["volumes"]
    assert pod["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}


def test_default_pods_have_no_extra_doors(helm: str) -> None:
    render = helm_template(helm, "--set", "scheduler.enabled=true,ui.enabled=true")
    assert len(render.all("Deployment")) == 4
    for deployment in render.all("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert "minReadySeconds" not in deployment["spec"]
        assert "initContainers" not in pod and "dnsConfig" not in pod
        assert len(pod["containers"]) == 1
        assert "lifecycle" not in pod["containers"][0]
        assert "envFrom" not in pod["containers"][0]


def test_extra_manifests_are_rendered_with_tpl(render_all: Render) -> None:
    extra = render_all.one("ConfigMap", "-shop-extra")
    assert extra["data"] == {"namespace": "shop"}
    text = render_all.one("ConfigMap", "-shop-text")
    assert text["metadata"]["name"] == "jobs-shop-text"
    assert text["data"] == {"app": "shop.tasks:app"}


def test_keda_fallback_and_behavior(render_all: Render, helm: str) -> None:
    spec = render_all.one("ScaledObject")["spec"]
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 4}
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 900}}
    plain = helm_template(helm, "--set", "keda.enabled=true", *API_FLAGS)
    assert "fallback" not in plain.one("ScaledObject")["spec"]
    assert "advanced" not in plain.one("ScaledObject")["spec"]


def test_chart_metadata_links_home_icon_and_sources() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    home = chart["home"]
    assert home.startswith("https://") and home.endswith("/")
    assert chart["icon"].startswith(home) and chart["icon"].endswith(".svg")
    assert (ROOT / "docs" / chart["icon"].removeprefix(home)).is_file()
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["prometheusRule"]["runbookBaseUrl"] == home


# --- the worker Deployment ------------------------------------------------------------


def test_termination_grace_period_exceeds_shutdown_timeout(rendered: Render) -> None:
    worker = rendered.one("Deployment", "-worker")
    env = env_of(container(worker))
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(env["OBSQ_SHUTDOWN_TIMEOUT"])


@pytest.mark.parametrize(("timeout", "margin"), [(25, 15), (100, 5), (3600, 60)])
def test_termination_grace_period_is_computed(helm: str, timeout: int, margin: int) -> None:
    render = helm_template(
        helm,
        "--set",
        f"worker.shutdownTimeout={timeout},worker.terminationGracePeriodMargin={margin}",
    )
    spec = render.one("Deployment", "-worker")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == timeout + margin
    assert env_of(spec["containers"][0])["OBSQ_SHUTDOWN_TIMEOUT"] == str(timeout)


def test_the_charts_default_shutdown_timeout_is_the_workers(helm: str) -> None:
    worker = helm_template(helm).one("Deployment", "-worker")
    timeout = float(env_of(container(worker))["OBSQ_SHUTDOWN_TIMEOUT"])
    assert timeout == WorkerSettings.shutdown_timeout


@pytest.mark.parametrize(("values", "grace", "timeout"), [
    ("", 40, 25),                                                     # the defaults
    ("worker.terminationGracePeriodSeconds=1815", 1815, 1800),        # the grace alone
    ("worker.shutdownTimeout=1800", 1815, 1800),                      # the timeout alone
    ("worker.shutdownTimeout=600,worker.terminationGracePeriodSeconds=900", 900, 600),
])
def test_one_decision_sets_the_grace_and_the_workers_timeout(
        helm: str, values: str, grace: int, timeout: int) -> None:
    render = helm_template(helm, *(["--set", values] if values else []))
    spec = render.one("Deployment", "-worker")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == grace
    assert env_of(spec["containers"][0])["OBSQ_SHUTDOWN_TIMEOUT"] == str(timeout)


@pytest.mark.parametrize("values", [
    "worker.shutdownTimeout=1800,worker.terminationGracePeriodSeconds=1800",
    "worker.terminationGracePeriodSeconds=10",
])
def test_a_grace_that_cannot_hold_the_drain_is_refused(helm: str, values: str) -> None:
    render = helm_template(helm, "--set", values, check=False)
    assert render.returncode != 0
    assert "worker.terminationGracePeriodSeconds" in render.stderr


def test_worker_container(rendered: Render) -> None:
    worker = rendered.one("Deployment", "-worker")
    pod = worker["spec"]["template"]["spec"]
    c = container(worker)
    assert c["command"] == ["obsq"]
    assert c["args"][0] == "worker" and ":" in c["args"][1]
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    # non-root, read-only root filesystem, nothing extra
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # writable places are emptyDirs: /tmp and the prometheus multiprocess directory
    env = env_of(c)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tmp"] == "/tmp"
    assert mounts["metrics"] == "/var/run/obsq-metrics"
    assert volumes["tmp"]["emptyDir"] == {} and volumes["metrics"]["emptyDir"] == {}
    assert pod["automountServiceAccountToken"] is False
    # multiprocess mode (which drops exemplars) only for more than one process
    assert ("PROMETHEUS_MULTIPROC_DIR" in env) == (env["OBSQ_PROCESSES"] != "1")


def test_multiprocess_metrics_directory_only_with_several_processes(helm: str) -> None:
    env = env_of(container(helm_template(helm, "--set", "worker.processes=3").one(
        "Deployment", "-worker")))
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/var/run/obsq-metrics"
    assert "PROMETHEUS_MULTIPROC_DIR" not in env_of(container(helm_template(helm).one(
        "Deployment", "-worker")))


def test_worker_environment_defaults(helm: str) -> None:
    render = helm_template(helm)
    env = env_of(container(render.one("Deployment", "-worker")))
    assert env["OBSQ_QUEUES"] == "critical=6,default=3"
    assert env["OBSQ_CONCURRENCY"] == "50"
    assert env["OBSQ_PROCESSES"] == "1"
    assert env["OBSQ_SHUTDOWN_TIMEOUT"] == "25"
    assert env["OBSQ_LEASE_SECONDS"] == "30"
    assert env["OBSQ_HTTP_PORT"] == "9191"
    assert env["OBSQ_NAMESPACE"] == "obsq"
    assert env["OBSQ_LOG_FORMAT"] == "json"
    assert env["OBSQ_REDIS_URL"] == "redis://redis:6379/0"
    assert env["OTEL_TRACES_EXPORTER"] == "none"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env
    assert (
        "prometheus.io/scrape"
        not in (render.one("Deployment", "-worker")["spec"]["template"]["metadata"]["annotations"])
    )


def test_worker_environment_all_features(render_all: Render) -> None:
    worker = render_all.one("Deployment", "-worker")
    env = env_of(container(worker))
    assert env["OBSQ_QUEUES"] == "critical=6,default.v2=3,low=1"
    assert env["OBSQ_STRICT_PRIORITY"] == "true"
    assert env["OBSQ_REDIS_URL"] == {"secretKeyRef": {"name": "obsq-redis", "key": "url"}}
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "shop-worker"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert "deployment.environment=production" in env["OTEL_RESOURCE_ATTRIBUTES"]
    assert env["SHOP_SETTINGS"] == "production" and env["SHOP_ROLE"] == "worker"
    template = worker["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9191"
    assert template["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert "replicas" not in worker["spec"]  # the autoscaler owns it
    assert container(worker)["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    spread = template["spec"]["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    scheduler = render_all.one("Deployment", "-scheduler")
    assert container(scheduler)["args"] == ["scheduler", "shop.tasks:app"]
    assert env_of(container(scheduler))["SHOP_ROLE"] == "scheduler"


def test_otel_service_name_defaults_to_fullname(helm: str) -> None:
    render = helm_template(
        helm, "--set", "tracing.enabled=true,tracing.endpoint=http://collector:4317"
    )
    env = env_of(container(render.one("Deployment", "-worker")))
    assert env["OTEL_SERVICE_NAME"] == "jobs-obsq"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"


def test_metrics_service_and_service_monitor(render_all: Render) -> None:
    service = render_all.one("Service", "-metrics")
    assert service["spec"]["ports"][0]["name"] == "http-metrics"
    assert service["spec"]["publishNotReadyAddresses"] is True
    monitor = render_all.one("ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["jobs"]}
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    worker_labels = render_all.one("Deployment", "-worker")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert service["spec"]["selector"].items() <= worker_labels.items()


# --- the scheduler Deployment -----------------------------------------------------------


def test_scheduler_probes(render_all: Render) -> None:
    c = container(render_all.one("Deployment", "-scheduler"))
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert env_of(c)["OBSQ_HTTP_PORT"] == "9191"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_scheduler_probes_can_be_turned_off(helm: str) -> None:
    render = helm_template(
        helm,
        "--set",
        "scheduler.enabled=true,scheduler.livenessProbe.enabled=false,"
        "scheduler.readinessProbe.enabled=false,metrics.port=9300",
    )
    c = container(render.one("Deployment", "-scheduler"))
    assert "livenessProbe" not in c and "readinessProbe" not in c
    assert env_of(c)["OBSQ_HTTP_PORT"] == "9300"
    assert c["ports"][0]["containerPort"] == 9300


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and `In` expressions) selects `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(
        labels.get(e["key"]) in e["values"]
        for e in selector.get("matchExpressions", [])
        if e["operator"] == "In"
    )


def scrape_targets(render: Render, suffix: str) -> dict[str, tuple[int, str]]:
    """How the rendered chart has Prometheus reach one Deployment's pods: by the
    ServiceMonitor (through a Service) and by the prometheus.io annotations, each as
    (container port, path)."""
    deployment = render.one("Deployment", suffix)
    pod = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    found = {}
    monitors = render.all("ServiceMonitor")
    for service in render.all("Service"):
        if not service["spec"]["selector"].items() <= pod["metadata"]["labels"].items():
            continue
        for monitor in monitors:
            if not _selects(monitor["spec"]["selector"], service["metadata"]["labels"]):
                continue
            for endpoint in monitor["spec"]["endpoints"]:
                for port in service["spec"]["ports"]:
                    if port["name"] == endpoint["port"] and port["targetPort"] in ports:
                        found["serviceMonitor"] = (ports[port["targetPort"]], endpoint["path"])
    annotations = pod["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        found["annotations"] = (int(annotations["prometheus.io/port"]),
                                annotations["prometheus.io/path"])
    return found


def test_scheduler_is_scraped_like_the_workers(render_all: Render) -> None:
    # obsq_scheduler_fires_total and obsq_scheduler_missed_total come only from the
    # scheduler's /metrics: the chart must scrape it as it scrapes the workers.
    worker = scrape_targets(render_all, "-worker")
    scheduler = scrape_targets(render_all, "-scheduler")
    assert worker == {"serviceMonitor": (9191, "/metrics"), "annotations": (9191, "/metrics")}
    assert scheduler == worker
    service = render_all.one("Service", "-scheduler")
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
    assert service["metadata"]["annotations"] == {"example.com/scrape": "true"}
    assert service["spec"]["publishNotReadyAddresses"] is True
    # Its Service selects the scheduler pods only.
    for suffix in ("-worker", "-exporter", "-ui"):
        labels = render_all.one("Deployment", suffix)["spec"]["template"]["metadata"]["labels"]
        assert not service["spec"]["selector"].items() <= labels.items(), suffix
    # The NetworkPolicy lets the scrapes through to the scheduler's metrics port.
    labels = render_all.one("Deployment", "-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert admitted_namespaces(render_all, labels, "http-metrics") == {
        "kubernetes.io/metadata.name": "monitoring"}


def test_production_example_scrapes_the_scheduler(helm: str) -> None:
    render = helm_template(
        helm, *SCENARIOS["production-example"], "--set", "metrics.podAnnotations=true"
    )
    assert scrape_targets(render, "-scheduler") == {
        "serviceMonitor": (9191, "/metrics"), "annotations": (9191, "/metrics")}


def test_scheduler_scrape_follows_the_values(helm: str) -> None:
    # No annotations unless metrics.podAnnotations; no Service without metrics.service.
    plain = helm_template(helm, "--set", "scheduler.enabled=true,metrics.port=9300")
    assert scrape_targets(plain, "-scheduler") == {}
    assert plain.one("Service", "-scheduler")["spec"]["ports"][0]["port"] == 9300
    no_service = helm_template(
        helm, "--set", "scheduler.enabled=true,metrics.service.enabled=false")
    assert [d["metadata"]["name"] for d in no_service.all("Service")] == []
    assert "jobs-obsq-scheduler" not in [d["metadata"]["name"] for d in helm_template(helm).docs]


def test_rendered_scheduler_serves_its_metrics_where_the_chart_scrapes(
    helm: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # A real `obsq scheduler` started with the rendered command and environment answers
    # at the port and path that the ServiceMonitor and the annotations point at.
    from obsq.redis_server import free_port

    (tmp_path / "schedapp.py").write_text(
        "import obsq\n\n"
        f"app = obsq.App(namespace={namespace!r})\n"
        'app.periodic("@every 1s", "tick")\n'
    )
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "app": "schedapp:app",
        "obsq": {"namespace": namespace, "logFormat": "text"},
        "redis": {"url": redis_url},
        "scheduler": {"enabled": True},
        "metrics": {"port": free_port(), "podAnnotations": True,
                    "serviceMonitor": {"enabled": True}},
    }))
    render = helm_template(helm, "-f", str(values), *API_FLAGS)
    targets = scrape_targets(render, "-scheduler")
    assert set(targets) == {"serviceMonitor", "annotations"}
    c = container(render.one("Deployment", "-scheduler"))
    env = {k: v for k, v in env_of(c).items() if isinstance(v, str) and k.startswith("OBSQ_")}
    log = tmp_path / "scheduler.log"
    scheduler = ObsqProcess(c["args"], obsq_env(**env), tmp_path, log)
    try:
        for port, path in set(targets.values()):
            def fires(port: int = port, path: str = path) -> bool:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    body = r.read().decode()
                return 'obsq_scheduler_fires_total{entry="tick"}' in body
            wait_for(fires, timeout=20, what=f"scheduler fires on :{port}{path}")
    finally:
        code = scheduler.stop()
        scheduler.close()
    assert code == 0, log.read_text()


# --- the exporter Deployment ------------------------------------------------------------


def test_exporter_publishes_the_queue_gauges_by_default(helm: str) -> None:
    # One exporter per installation reads the queue gauges from Redis; the chart's workers
    # leave them out. Without the exporter, the workers keep them.
    render = helm_template(helm)
    assert [d["metadata"]["name"] for d in render.all("Deployment")] == [
        "jobs-obsq-exporter", "jobs-obsq-worker"]
    assert [d["metadata"]["name"] for d in render.all("Service")] == [
        "jobs-obsq-metrics", "jobs-obsq-exporter"]
    assert env_of(container(render.one("Deployment", "-worker")))["OBSQ_QUEUE_METRICS"] == "false"
    assert "OBSQ_QUEUE_METRICS" not in env_of(container(render.one("Deployment", "-exporter")))
    alone = helm_template(helm, "--set", "exporter.enabled=false")
    assert [d["metadata"]["name"] for d in alone.all("Deployment")] == ["jobs-obsq-worker"]
    assert "OBSQ_QUEUE_METRICS" not in env_of(container(alone.one("Deployment", "-worker")))


def test_exporter_deployment(render_all: Render) -> None:
    exporter = render_all.one("Deployment", "-exporter")
    worker = render_all.one("Deployment", "-worker")
    assert exporter["spec"]["replicas"] == 2
    pod = exporter["spec"]["template"]["spec"]
    c = container(exporter)
    assert c["name"] == "exporter"
    assert c["command"] == ["obsq"] and c["args"] == ["exporter"]
    assert c["image"] == container(worker)["image"]
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["resources"]["requests"] == {"cpu": "20m", "memory": "64Mi"}
    # The same non-root, read-only settings as the workers.
    assert pod["securityContext"] == worker["spec"]["template"]["spec"]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == container(worker)["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    # The same Redis, key namespace and port as the workers.
    env, worker_env = env_of(c), env_of(container(worker))
    for name in ("OBSQ_REDIS_URL", "OBSQ_NAMESPACE", "OBSQ_HTTP_PORT", "OBSQ_LOG_FORMAT"):
        assert env[name] == worker_env[name], name
    assert env["OBSQ_REDIS_URL"] == {"secretKeyRef": {"name": "obsq-redis", "key": "url"}}
    assert env["SHOP_ROLE"] == "exporter"
    assert "OBSQ_QUEUES" not in env
    # Not selected by the worker Deployment, PDB or scalers.
    labels = exporter["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "exporter"
    assert labels["tier"] == "observability"
    worker_selector = worker["spec"]["selector"]["matchLabels"]
    assert not worker_selector.items() <= labels.items()
    pdb = render_all.one("PodDisruptionBudget", "-worker")
    pdb_selector = pdb["spec"]["selector"]["matchLabels"]
    assert not pdb_selector.items() <= labels.items()


def test_exporter_default_values(helm: str) -> None:
    render = helm_template(helm, "--set", "exporter.enabled=true")
    exporter = render.one("Deployment", "-exporter")
    assert exporter["spec"]["replicas"] == 1
    c = container(exporter)
    assert env_of(c)["OBSQ_REDIS_URL"] == "redis://redis:6379/0"
    assert env_of(c)["OBSQ_NAMESPACE"] == "obsq"
    assert env_of(c)["OBSQ_HTTP_PORT"] == "9191"
    assert c["livenessProbe"]["periodSeconds"] == 10
    assert c["readinessProbe"]["periodSeconds"] == 5
    off = helm_template(
        helm,
        "--set",
        "exporter.enabled=true,exporter.livenessProbe.enabled=false,"
        "exporter.readinessProbe.enabled=false",
    )
    c = container(off.one("Deployment", "-exporter"))
    assert "livenessProbe" not in c and "readinessProbe" not in c


def test_exporter_is_scraped_by_the_service_monitor(render_all: Render) -> None:
    monitor = render_all.one("ServiceMonitor")
    selector = monitor["spec"]["selector"]

    def selects(labels: dict[str, str]) -> bool:
        if not selector["matchLabels"].items() <= labels.items():
            return False
        return all(
            labels.get(e["key"]) in e["values"]
            for e in selector.get("matchExpressions", [])
            if e["operator"] == "In"
        )

    services = {d["metadata"]["name"]: d for d in render_all.all("Service")}
    assert set(services) == {"jobs-obsq-metrics", "jobs-obsq-exporter", "jobs-obsq-scheduler",
                             "jobs-obsq-ui"}
    assert not selects(services.pop("jobs-obsq-ui")["metadata"]["labels"])  # the console
    for service in services.values():
        assert selects(service["metadata"]["labels"]), service["metadata"]["name"]
        assert service["spec"]["ports"][0]["name"] == "http-metrics"
    exporter_pod = render_all.one("Deployment", "-exporter")["spec"]["template"]["metadata"]
    worker_pod = render_all.one("Deployment", "-worker")["spec"]["template"]["metadata"]
    exporter_selector = services["jobs-obsq-exporter"]["spec"]["selector"]
    assert exporter_selector.items() <= exporter_pod["labels"].items()
    assert not exporter_selector.items() <= worker_pod["labels"].items()
    # The workers' Service keeps selecting only the workers (their job label is unchanged).
    metrics_selector = services["jobs-obsq-metrics"]["spec"]["selector"]
    assert not metrics_selector.items() <= exporter_pod["labels"].items()
    # The NetworkPolicy lets the scrapes through to the exporter too.
    policy = render_all.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
    assert policy.items() <= exporter_pod["labels"].items()


def test_production_example_runs_the_exporter(helm: str) -> None:
    render = helm_template(helm, *SCENARIOS["production-example"])
    assert container(render.one("Deployment", "-exporter"))["args"] == ["exporter"]


# --- the console (obsq ui) -------------------------------------------------------------


def test_console_is_off_by_default_and_read_only_without_a_secret(helm: str) -> None:
    assert "jobs-obsq-ui" not in [d["metadata"]["name"] for d in helm_template(helm).docs]
    c = container(helm_template(helm, "--set", "ui.enabled=true").one("Deployment", "-ui"))
    env = env_of(c)
    assert "OBSQ_UI_TOKEN" not in env and "OBSQ_UI_TRACE_URL" not in env
    assert env["OBSQ_UI_READ_ONLY"] == "false" and env["OBSQ_UI_PORT"] == "8181"


def test_console_deployment_and_service(render_all: Render) -> None:
    ui = render_all.one("Deployment", "-ui")
    worker = render_all.one("Deployment", "-worker")
    pod = ui["spec"]["template"]["spec"]
    c = container(ui)
    assert c["command"] == ["obsq"] and c["args"] == ["ui"]
    assert c["image"] == container(worker)["image"]
    assert c["ports"] == [{"name": "http", "containerPort": 8181, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The same non-root, read-only settings as the workers.
    assert pod["securityContext"] == worker["spec"]["template"]["spec"]["securityContext"]
    assert c["securityContext"] == container(worker)["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    env, worker_env = env_of(c), env_of(container(worker))
    for name in ("OBSQ_REDIS_URL", "OBSQ_NAMESPACE"):
        assert env[name] == worker_env[name], name
    assert env["OBSQ_UI_HOST"] == "0.0.0.0"
    assert env["OBSQ_UI_TOKEN"] == {"secretKeyRef": {"name": "obsq-ui", "key": "ui-token"}}
    assert "{trace_id}" in env["OBSQ_UI_TRACE_URL"] and env["SHOP_ROLE"] == "console"
    service = render_all.one("Service", "-ui")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8181, "targetPort": "http",
                                         "protocol": "TCP"}]
    labels = ui["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert labels["app.kubernetes.io/component"] == "ui" and labels["tier"] == "console"
    assert not worker["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The NetworkPolicy lets the console's port through, from the peers given.
    assert admitted_namespaces(render_all, labels, "http") == {
        "kubernetes.io/metadata.name": "ingress"}


# --- autoscaling ------------------------------------------------------------------------


def test_keda_scaled_object(render_all: Render) -> None:
    scaled = render_all.one("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "jobs-obsq-worker"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value"
    query = trigger["metadata"]["query"]
    selector = ('namespace="jobs", app_kubernetes_io_instance="jobs", '
                'queue=~"critical|default\\\\.v2|low"')
    assert query == (
        f"max(obsq_queue_latency_seconds{{{selector}}}"
        f" unless on (namespace, queue) (obsq_queue_paused{{{selector}}} == 1))"
    )
    assert not unknown_metrics(query)
    assert trigger["metadata"]["threshold"] == "20"
    assert trigger["authenticationRef"] == {"name": "prometheus-auth"}


def test_keda_on_queue_depth(helm: str) -> None:
    render = helm_template(helm, "--set", "keda.enabled=true,keda.metric=depth", *API_FLAGS)
    (trigger,) = render.one("ScaledObject")["spec"]["triggers"]
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["query"] == (
        "sum(max by (queue) (obsq_queue_depth"
        '{namespace="jobs", app_kubernetes_io_instance="jobs", queue=~"critical|default",'
        ' state="pending"} unless on (namespace, queue) (obsq_queue_paused{namespace="jobs",'
        ' app_kubernetes_io_instance="jobs", queue=~"critical|default"} == 1)))'
    )


def test_keda_queries_parse(helm: str, promtool: str, tmp_path: Path) -> None:
    rules = []
    for metric in ("latency", "depth"):
        render = helm_template(
            helm, "-f", str(HERE / "values-all.yaml"), "--set", f"keda.metric={metric}"
        )
        (trigger,) = render.one("ScaledObject")["spec"]["triggers"]
        rules.append({"record": f"keda:{metric}", "expr": trigger["metadata"]["query"]})
    path = tmp_path / "keda.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": rules}]}))
    proc = run([promtool, "check", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Two scraped processes (two exporter replicas, or workers outside the chart) export the
# same queue gauges; `low` is paused with a growing backlog, another installation
# (namespace `other`) has a busier `critical` queue, and a paused `critical` there must not
# hide this one's; a third (release `mail` in the same namespace) has a busier `critical`.
KEDA_SERIES = [
    *[
        {"series": f'{name}{{namespace="jobs", app_kubernetes_io_instance="jobs", '
                   f'instance="{instance}", queue="{queue}"{extra}}}',
         "values": values}
        for instance in ("exporter-a", "exporter-b")
        for name, extra, queue, values in [
            ("obsq_queue_latency_seconds", "", "critical", "5+0x10"),
            ("obsq_queue_latency_seconds", "", "default.v2", "12+0x10"),
            ("obsq_queue_latency_seconds", "", "low", "600+60x10"),
            ("obsq_queue_depth", ', state="pending"', "critical", "3+0x10"),
            ("obsq_queue_depth", ', state="pending"', "default.v2", "4+0x10"),
            ("obsq_queue_depth", ', state="pending"', "low", "500+100x10"),
            ("obsq_queue_paused", "", "critical", "0+0x10"),
            ("obsq_queue_paused", "", "default.v2", "0+0x10"),
            ("obsq_queue_paused", "", "low", "1+0x10"),
        ]
    ],
    {"series": 'obsq_queue_latency_seconds{namespace="other", instance="x", queue="critical"}',
     "values": "9000+0x10"},
    {"series": 'obsq_queue_paused{namespace="other", instance="x", queue="critical"}',
     "values": "1+0x10"},
    {"series": 'obsq_queue_latency_seconds{namespace="jobs", app_kubernetes_io_instance="mail",'
               ' instance="y", queue="critical"}', "values": "7000+0x10"},
    {"series": 'obsq_queue_depth{namespace="jobs", app_kubernetes_io_instance="mail",'
               ' instance="y", queue="critical", state="pending"}', "values": "900+0x10"},
]


def test_keda_queries_leave_out_paused_queues(helm: str, promtool: str, tmp_path: Path) -> None:
    # `obsq pause low`: its latency and backlog keep growing, but no worker may take its
    # tasks, so it must not drive the replicas (to maxReplicaCount).
    queries = {}
    for metric in ("latency", "depth"):
        render = helm_template(
            helm, "-f", str(HERE / "values-all.yaml"), "--set", f"keda.metric={metric}",
            *API_FLAGS,
        )
        (trigger,) = render.one("ScaledObject")["spec"]["triggers"]
        queries[metric] = trigger["metadata"]["query"]
    all_paused = [
        {**s, "values": "1+0x10"} if s["series"].startswith("obsq_queue_paused") else s
        for s in KEDA_SERIES
    ]
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": KEDA_SERIES,
                "promql_expr_test": [
                    # the oldest task of the queues workers may take: default.v2's 12 s
                    {"expr": queries["latency"], "eval_time": "5m",
                     "exp_samples": [{"labels": "{}", "value": 12}]},
                    # pending tasks of critical and default.v2 only
                    {"expr": queries["depth"], "eval_time": "5m",
                     "exp_samples": [{"labels": "{}", "value": 7}]},
                ],
            },
            {
                # every queue paused: no sample, which KEDA reads as 0 (ignoreNullValues)
                "interval": "1m",
                "input_series": all_paused,
                "promql_expr_test": [
                    {"expr": queries["latency"], "eval_time": "5m", "exp_samples": []},
                    {"expr": queries["depth"], "eval_time": "5m", "exp_samples": []},
                ],
            },
        ],
    }
    path = tmp_path / "keda.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = run([promtool, "test", "rules", str(path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hpa(helm: str) -> None:
    render = helm_template(helm, *SCENARIOS["all-hpa"])
    hpa = render.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "jobs-obsq-worker"
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in render.one("Deployment", "-worker")["spec"]


# --- dashboards and alerts come from the repository's single sources ------------------


def test_chart_folders_are_relative_symlinks_to_the_sources() -> None:
    for name in ("dashboards", "alerts"):
        link = CHART / name
        assert link.is_symlink(), f"{link} must be a symlink"
        target = link.readlink()
        assert not target.is_absolute() and str(target) == f"../../../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def test_dashboard_configmap_equals_the_dashboard_files(render_all: Render) -> None:
    configmap = render_all.one("ConfigMap", "-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "obsq"}
    files = {p.name: p.read_bytes() for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert sorted(files) == ["obsq-overview.json", "obsq-task.json"]
    data = {key: value.encode("utf-8") for key, value in configmap["data"].items()}
    assert data == files  # byte for byte
    for content in data.values():
        json.loads(content)


def test_prometheus_rule_embeds_the_rules_file(render_all: Render) -> None:
    rule = render_all.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load((ROOT / "alerts" / "obsq.rules.yml").read_text())
    rendered_rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    source_rules = [r for g in source["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rendered_rules] == [r["alert"] for r in source_rules]
    for got, want in zip(rendered_rules, source_rules, strict=True):
        assert got["expr"] == want["expr"]
        assert got.get("for") == want.get("for")
        assert got["labels"] == {**want["labels"], "team": "shop"}
        assert got["annotations"]["summary"] == want["annotations"]["summary"]
        assert got["annotations"]["runbook_url"] == want["annotations"]["runbook_url"].replace(
            HOME, "https://docs.example.com/obsq/v0.1.0/")


def test_prometheus_rule_spec_passes_promtool(
    render_all: Render, promtool: str, tmp_path: Path
) -> None:
    spec = tmp_path / "prometheusrule-spec.yml"
    spec.write_text(yaml.safe_dump(render_all.one("PrometheusRule")["spec"]))
    proc = run([promtool, "check", "rules", str(spec)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = len(yaml.safe_load((ROOT / "alerts" / "obsq.rules.yml").read_text())["groups"][0]
                ["rules"])
    assert f"SUCCESS: {rules} rules found" in proc.stdout


def test_prometheus_rule_disabled_alerts(helm: str) -> None:
    render = helm_template(
        helm,
        "--set",
        "prometheusRule.enabled=true,prometheusRule.disabledAlerts={ObsqRedisErrors}",
        *API_FLAGS,
    )
    names = [r["alert"] for g in render.one("PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    every = yaml.safe_load((ROOT / "alerts" / "obsq.rules.yml").read_text())["groups"]
    assert "ObsqRedisErrors" not in names
    assert len(names) == sum(len(g["rules"]) for g in every) - 1
    runbooks = [
        r["annotations"]["runbook_url"]
        for g in render.one("PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
    ]
    assert all(url.startswith(f"{HOME}runbook.html#") for url in runbooks)


def test_alert_thresholds_and_durations_come_from_the_values(helm: str) -> None:
    # The defaults of prometheusRule.alerts are the numbers of alerts/obsq.rules.yml.
    values = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    source = {r["alert"]: r for g in yaml.safe_load((ROOT / "alerts" / "obsq.rules.yml")
                                                    .read_text())["groups"] for r in g["rules"]}
    assert set(values) == set(source)
    # The schema knows the same alerts (it refuses any other name).
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule_schema = schema["properties"]["prometheusRule"]["properties"]
    assert set(rule_schema["alerts"]["properties"]) == set(source)
    assert set(rule_schema["disabledAlerts"]["items"]["enum"]) == set(source)
    for name, tuning in values.items():
        assert tuning.get("for") == source[name].get("for"), name
        if "threshold" in tuning:
            assert re.search(rf"[<>] {tuning['threshold']}\n", source[name]["expr"]), name
    tuned = helm_template(helm, "--set", "prometheusRule.enabled=true", "--set-json",
                          'prometheusRule.alerts={"ObsqQueueLatencyHigh": {"threshold": 900,'
                          ' "for": "15m"}, "ObsqHighFailureRatio": {"threshold": 0.25,'
                          ' "minRuns": 100}, "ObsqWorkersDown": {"for": "2m"}}', *API_FLAGS)
    rules = {r["alert"]: r for g in tuned.one("PrometheusRule")["spec"]["groups"]
             for r in g["rules"]}
    latency = rules["ObsqQueueLatencyHigh"]
    assert latency["for"] == "15m"
    assert latency["expr"] == source["ObsqQueueLatencyHigh"]["expr"].replace("> 300", "> 900")
    ratio = rules["ObsqHighFailureRatio"]["expr"]
    assert ratio == (source["ObsqHighFailureRatio"]["expr"]
                     .replace(") > 0.1\n", ") > 0.25\n").replace(">= 20\n", ">= 100\n"))
    assert rules["ObsqHighFailureRatio"]["for"] == "10m"  # the default, kept
    assert rules["ObsqWorkersDown"]["for"] == "2m"
    # A number set on --set arrives as a string: accepted when it is one.
    as_string = helm_template(helm, "--set", "prometheusRule.enabled=true,"
                              "prometheusRule.alerts.ObsqRedisErrors.threshold=0.5", *API_FLAGS)
    errors = next(r for g in as_string.one("PrometheusRule")["spec"]["groups"]
                  for r in g["rules"] if r["alert"] == "ObsqRedisErrors")
    assert "> 0.5\n" in errors["expr"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("prometheusRule.alerts.ObsqWorkersDown.threshold=1", "no single comparison"),
        ("prometheusRule.alerts.ObsqQueueLatencyHigh.minRuns=5", "no single comparison"),
        ("prometheusRule.alerts.ObsqNoSuchAlert.for=5m", "ObsqNoSuchAlert"),
        ("prometheusRule.alerts.ObsqQueueLatencyHigh.for=soon", "for"),
        ("prometheusRule.alerts.ObsqQueueLatencyHigh.threshold=high", "threshold"),
    ],
)
def test_alert_tuning_refuses_what_it_cannot_apply(helm: str, setting: str,
                                                   message: str) -> None:
    render = helm_template(helm, "--set", f"prometheusRule.enabled=true,{setting}",
                           *API_FLAGS, check=False)
    assert render.returncode != 0 and message in render.stderr, render.stderr


def test_no_worker_pod_is_no_alert_when_keda_scales_to_zero(helm: str) -> None:
    def alerts(*values: str) -> set[str]:
        render = helm_template(helm, "--set", ",".join(["prometheusRule.enabled=true",
                                                        *values]), *API_FLAGS)
        return {r["alert"] for g in render.one("PrometheusRule")["spec"]["groups"]
                for r in g["rules"]}

    assert "ObsqWorkersAbsent" in alerts()
    assert "ObsqWorkersAbsent" in alerts("keda.enabled=true")
    at_zero = alerts("keda.enabled=true", "keda.minReplicaCount=0")
    assert "ObsqWorkersAbsent" not in at_zero and "ObsqWorkersDown" in at_zero


def test_tuned_rules_pass_promtool_unit_tests(helm: str, promtool: str, tmp_path: Path) -> None:
    # With a failure-ratio threshold of 25 % over at least 100 runs in 5 minutes, 18 %
    # of 110 runs a minute stays quiet (it fires with the defaults), 30 % fires.
    tuned = helm_template(helm, "--set", "prometheusRule.enabled=true", "--set-json",
                          'prometheusRule.alerts={"ObsqHighFailureRatio": {"threshold": 0.25,'
                          ' "minRuns": 100}}', *API_FLAGS)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(tuned.one("PrometheusRule")["spec"]))

    def series(task: str, outcome: str, per_minute: int) -> dict[str, str]:
        return {"series": f'obsq_tasks_processed_total{{namespace="jobs", '
                          f'app_kubernetes_io_instance="jobs", queue="default", task="{task}", '
                          f'outcome="{outcome}"}}', "values": f"0+{per_minute}x30"}

    def firing(task: str, ratio: str) -> dict[str, Any]:
        return {"exp_labels": {"severity": "warning", "namespace": "jobs",
                               "app_kubernetes_io_instance": "jobs", "queue": "default",
                               "task": task},
                "exp_annotations": {
                    "summary": f"obsq task {task} fails often",
                    "description": f"{ratio} of the runs of {task} in queue default "
                                   "(namespace jobs) fail (retry or dead).",
                    "runbook_url": f"{HOME}runbook.html#obsqhighfailureratio"}}

    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [series("mild", "success", 90), series("mild", "retry", 20),
                         series("bad", "success", 77), series("bad", "dead", 33)],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "ObsqHighFailureRatio",
                             "exp_alerts": [firing("bad", "30%")]}]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    proc = run([promtool, "test", "rules", str(tmp_path / "tests.yml")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same series with the defaults: "mild" fires too.
    default = helm_template(helm, "--set", "prometheusRule.enabled=true", *API_FLAGS)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(default.one("PrometheusRule")["spec"]))
    proc = run([promtool, "test", "rules", str(tmp_path / "tests.yml")])
    assert proc.returncode != 0 and 'task="mild"' in proc.stdout + proc.stderr


def test_extra_rules_follow_in_their_own_group(helm: str, promtool: str, tmp_path: Path) -> None:
    extra = [{"alert": "ShopBacklog", "expr": 'obsq_queue_depth{queue="orders"} > 1000',
              "labels": {"severity": "warning"},
              "annotations": {"runbook_url": "docs/shop.md#backlog"}},
             {"record": "shop:orders:pending", "expr": 'obsq_queue_depth{queue="orders"}'}]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"prometheusRule": {
        "enabled": True, "extraRules": extra, "ruleLabels": {"team": "shop"},
        "runbookBaseUrl": "https://git.example.com/shop"}}))
    render = helm_template(helm, "-f", str(values), *API_FLAGS)
    groups = render.one("PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in groups] == ["obsq", "obsq-extra"]
    alert, record = groups[1]["rules"]
    assert alert["labels"] == {"severity": "warning", "team": "shop"}
    assert alert["annotations"]["runbook_url"] == "https://git.example.com/shop/docs/shop.md#backlog"
    assert record == extra[1]
    assert all(r["annotations"]["runbook_url"].startswith("https://git.example.com/shop/runbook.html#")
               for r in groups[0]["rules"])
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(render.one("PrometheusRule")["spec"]))
    proc = run([promtool, "check", "rules", str(spec)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_test_pod_asks_a_worker_through_its_service(render_all: Render) -> None:
    pod = render_all.one("Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["image"] == container(render_all.one("Deployment", "-worker"))["image"]
    assert c["args"][-1] == "http://jobs-obsq-metrics:9191/readyz"
    service = render_all.one("Service", "-metrics")
    assert service["spec"]["ports"][0]["port"] == 9191
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # The NetworkPolicy lets it in to the workers and out to them.
    policy = render_all.one("NetworkPolicy")["spec"]
    labels = pod["metadata"]["labels"]
    peers = [p for rule in policy["ingress"] for p in rule.get("from", [])]
    assert any(p.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
               and "podSelector" in p for p in peers)
    worker = render_all.one("Deployment", "-worker")["spec"]["template"]["metadata"]["labels"]
    assert any(rule["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
               and rule["to"][0]["podSelector"]["matchLabels"].items() <= worker.items()
               for rule in policy["egress"] if "to" in rule)


def test_helm_test_pod_can_be_left_out(helm: str) -> None:
    assert helm_template(helm, "--set", "tests.enabled=false").all("Pod") == []
    assert helm_template(helm, "--set", "metrics.service.enabled=false").all("Pod") == []


def test_helm_package_follows_the_symlinks(helm: str, tmp_path: Path) -> None:
    proc = run([helm, "package", str(CHART), "--destination", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (archive,) = tmp_path.glob("obsq-*.tgz")
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in (
            "obsq/dashboards/obsq-overview.json",
            "obsq/dashboards/obsq-task.json",
            "obsq/alerts/obsq.rules.yml",
        ):
            assert members[name].isfile(), f"{name} is not a regular file in the package"
        packaged = tar.extractfile("obsq/alerts/obsq.rules.yml").read()
    assert packaged == (ROOT / "alerts" / "obsq.rules.yml").read_bytes()
    assert "obsq/dashboards/generate.py" not in members
    assert "obsq/alerts/obsq.rules.test.yml" not in members


# --- documentation ----------------------------------------------------------------------


def _value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    opaque = {"podSecurityContext", "securityContext", "strategy", "resources", "alerts"}
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in opaque:
            paths += _value_paths(value, path + ".")
        else:
            paths.append(path)
    return paths


def test_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    paths = _value_paths(values)
    assert set(paths) - documented == set(), "values missing from README.md"
    assert documented - set(paths) == set(), "README.md documents values that do not exist"


def test_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        node = schema["definitions"][node["$ref"].split("/")[-1]] if "$ref" in node else node
        if node.get("properties") is None:
            return
        assert node.get("additionalProperties") is False, f"{path or '.'} allows unknown keys"
        for key, child in value.items():
            assert key in node["properties"], f"{path}{key} is not in the schema"
            if isinstance(child, dict):
                walk(node["properties"][key], child, f"{path}{key}.")

    walk(schema, values, "")


# --- the chart speaks the worker's settings -------------------------------------------


@pytest.mark.parametrize("scenario_name", ["default", "all-keda"])
def test_worker_settings_accept_the_rendered_environment(helm: str, scenario_name: str) -> None:
    settings_module = pytest.importorskip("obsq.settings")
    render = helm_template(helm, *SCENARIOS[scenario_name])
    env = env_of(container(render.one("Deployment", "-worker")))
    plain = {k: v for k, v in env.items() if isinstance(v, str) and k.startswith("OBSQ_")}
    settings = settings_module.WorkerSettings.from_env(environ=plain)
    queues = ",".join(f"{name}={weight}" for name, weight in settings.queues.items())
    assert queues == env["OBSQ_QUEUES"]
    assert settings.concurrency == int(env["OBSQ_CONCURRENCY"])
    assert settings.processes == int(env["OBSQ_PROCESSES"])
    assert settings.shutdown_timeout == float(env["OBSQ_SHUTDOWN_TIMEOUT"])
    assert settings.lease_seconds == float(env["OBSQ_LEASE_SECONDS"])
    assert settings.http_port == int(env["OBSQ_HTTP_PORT"])
    assert settings.strict_priority is (env["OBSQ_STRICT_PRIORITY"] == "true")
    assert settings.max_recoveries == int(env["OBSQ_MAX_RECOVERIES"])
    assert settings.pool == env["OBSQ_POOL"]
    assert settings.loop == env["OBSQ_LOOP"] == "auto"
    assert settings.stuck_limit == float(env["OBSQ_STUCK_LIMIT"])
    assert settings.unknown_type_max_age == float(env["OBSQ_UNKNOWN_TYPE_MAX_AGE"])
    assert settings.log_format == env["OBSQ_LOG_FORMAT"]
    assert settings.namespace == env["OBSQ_NAMESPACE"]
    assert settings.queue_metrics is False  # the exporter publishes them


def test_obsq_command_line_accepts_the_rendered_arguments(render_all: Render) -> None:
    cli = pytest.importorskip("obsq.cli")
    for suffix in ("-worker", "-scheduler"):
        c = container(render_all.one("Deployment", suffix))
        assert c["command"] == ["obsq"]
        args = cli.build_parser().parse_args(c["args"])
        assert args.command == suffix.lstrip("-")
        assert args.app == "shop.tasks:app"
    scheduler = cli.build_parser().parse_args(
        container(render_all.one("Deployment", "-scheduler"))["args"]
    )
    assert scheduler.http_port is None  # from OBSQ_HTTP_PORT
    c = container(render_all.one("Deployment", "-exporter"))
    args = cli.build_parser().parse_args(c["args"])
    assert args.command == "exporter"
    assert args.http_port is None  # from OBSQ_HTTP_PORT


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["obsq stats", "WARNING: `app` is still the placeholder", "redis.existingSecret",
              "helm test jobs -n jobs"]),
        (
            ["-f", str(HERE / "values-all.yaml"), "--set", "keda.minReplicaCount=0"],
            ["scaled by KEDA between 0 and 40", "runs `obsq exporter` (2 replica(s))",
             "dashboards"],
        ),
        (
            ["--set", "keda.enabled=true,keda.minReplicaCount=0,exporter.enabled=false"],
            ["keda.minReplicaCount is 0 but exporter.enabled is false",
             "Set exporter.enabled=true"],
        ),
    ],
    ids=["default", "all", "keda-zero-without-exporter"],
)
def test_notes_render(args: list[str], expected: list[str]) -> None:
    # Helm 4 renders NOTES.txt without a cluster (install --dry-run=client); Helm 3.17
    # still asks the cluster for its version there.
    helm4 = find_tool("helm")
    proc = run([helm4, "install", "jobs", str(CHART), "-n", "jobs", "--dry-run=client", *args])
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    for text in expected:
        assert text in notes
    if "values-all.yaml" in " ".join(args):  # exporter.enabled: no warning about it
        assert "exporter.enabled is false" not in notes


# --- Redis credentials and TLS files: only from Secrets in production --------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "production=true"], "existingSecret"),
        (
            ["--set", "production=true,redis.existingSecret=obsq-redis",
             "--set", "redis.url=redis://:s3cret@redis:6379/0"],
            "url",
        ),
        (
            ["--set", "production=true,redis.existingSecret=obsq-redis",
             "--set", "redis.url=rediss://obsq:s3cret@redis:6380/0?ssl_ca_certs=/tls/ca.crt"],
            "url",
        ),
    ],
    ids=["no-secret", "password-in-url", "user-and-password-in-url"],
)
def test_production_refuses_redis_credentials_in_plain_values(
    helm: str, args: list[str], message: str
) -> None:
    render = helm_template(helm, *args, check=False)
    assert render.returncode != 0, f"{args} was accepted"
    assert message in render.stderr and "s3cret" not in render.stderr, render.stderr


def test_production_takes_the_url_from_a_secret(helm: str) -> None:
    render = helm_template(
        helm, "--set", "production=true,redis.existingSecret=obsq-redis",
        "--set", "redis.url=rediss://obsq@redis:6380/0",  # a user, no password: allowed
    )
    env = container(render.one("Deployment", "-worker"))["env"]
    (url,) = [e for e in env if e["name"] == "OBSQ_REDIS_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "obsq-redis", "key": "redis-url"}
    # outside production a plain URL with a password still renders (development)
    helm_template(helm, "--set", "redis.url=redis://:dev@localhost:6379/0")


def test_production_example_sets_the_guard() -> None:
    values = yaml.safe_load((ROOT / "examples" / "helm" / "values-production.yaml").read_text())
    assert values["production"] is True and values["redis"]["existingSecret"]


def test_redis_tls_files_come_from_a_secret_in_every_container(helm: str) -> None:
    render = helm_template(
        helm, "--set", "redis.url=rediss://redis:6380/0,redis.tls.existingSecret=obsq-redis-tls",
        "--set", "scheduler.enabled=true,exporter.enabled=true,ui.enabled=true",
    )
    deployments = render.all("Deployment")
    assert {d["metadata"]["name"].rsplit("-", 1)[1] for d in deployments} == {
        "worker", "scheduler", "exporter", "ui"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "redis-tls"]
        assert volume["secret"]["secretName"] == "obsq-redis-tls"
        (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == "redis-tls"]
        assert mount == {"name": "redis-tls", "mountPath": "/etc/obsq/redis-tls",
                         "readOnly": True}
        env = env_of(container(deployment))
        assert {k: v for k, v in env.items() if k.startswith("OBSQ_REDIS_TLS_")} == {
            "OBSQ_REDIS_TLS_CA": "/etc/obsq/redis-tls/ca.crt",
            "OBSQ_REDIS_TLS_CERT": "/etc/obsq/redis-tls/tls.crt",
            "OBSQ_REDIS_TLS_KEY": "/etc/obsq/redis-tls/tls.key",
        }
    server_only = helm_template(
        helm, "--set", "redis.tls.existingSecret=ca-only,redis.tls.certKey=,redis.tls.keyKey=")
    env = env_of(container(server_only.one("Deployment", "-worker")))
    assert "OBSQ_REDIS_TLS_CERT" not in env and env["OBSQ_REDIS_TLS_CA"].endswith("/ca.crt")
    no_tls = env_of(container(helm_template(helm).one("Deployment", "-worker")))
    assert not [k for k in no_tls if k.startswith("OBSQ_REDIS_TLS_")]


def test_the_minimal_example_names_the_apps_namespace_as_the_values_say_it_must() -> None:
    """The chart cannot read the App's namespace from the code, and the exporter and the
    dashboards need one: the minimal example sets it, and the value's description says it
    must be the App's (the workers warn at start when it is not)."""
    example = yaml.safe_load((ROOT / "examples" / "helm" / "values-minimal.yaml").read_text())
    assert example["obsq"]["namespace"]
    described = (CHART / "values.yaml").read_text().split("  namespace: obsq")[0]
    assert "Set it to your App's namespace" in described.splitlines()[-1]
    assert "Set it to your App's namespace" in (CHART / "README.md").read_text()


def test_the_chart_values_the_docs_show_render_as_they_say(helm: str, tmp_path: Path) -> None:
    """Every yaml block of the pages is chart values that render; the long-task example
    drains for the 20 minutes its comments say, within the pod's grace."""
    from pages import blocks

    shown = blocks("yaml")
    assert shown
    for block in shown:
        values = tmp_path / "values.yaml"
        values.write_text(block.text)
        render = helm_template(helm, "-f", str(values))
        if "shutdownTimeout: 1200" in block.text:
            worker = render.one("Deployment", "-worker")
            env = {e["name"]: e.get("value") for e in container(worker).get("env", [])}
            assert env["OBSQ_SHUTDOWN_TIMEOUT"] == "1200", block.where
            assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 1220
