"""A real Prometheus scraping a real worker: the contract's names as PromQL sees them,
and histogram exemplars that lead to the task's trace, as the dashboards' latency panels
ask for them."""

from __future__ import annotations

import json
import time

from deploy.promql import substitute
from support import ROOT, wait_until

import obsq


async def test_prometheus_scrapes_a_worker(app, redis_url, namespace, spans, prometheus,
                                           start_worker):
    queue = f"prom-{namespace}"

    @app.task("ok", queue=queue)
    async def ok(task):
        return None

    @app.task("fail", queue=queue, max_retry=1, retry_delay=0)
    async def fail(task):
        raise ValueError("nope")

    worker = await start_worker(queues={queue: 1}, metrics=True, tracing=True, http_port=0)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    for _ in range(5):
        await client.enqueue("ok")
    await client.enqueue("fail")
    await wait_until(lambda: len([s for s in spans.get_finished_spans()
                                  if s.name == f"process {queue}"]) == 7, what="7 runs")
    prom = prometheus([f"127.0.0.1:{start_worker.port(worker)}"])

    by_outcome = f'sum by (outcome) (obsq_tasks_processed_total{{queue="{queue}"}}) > 0'
    await prom.wait_for(by_outcome, lambda r: len(r) == 3, timeout=30)
    assert prom.values(by_outcome, "outcome") == {("success",): 5, ("retry",): 1,
                                                  ("dead",): 1}
    assert prom.values('up{job="obsq"}', "job") == {("obsq",): 1}
    assert prom.values(f'obsq_tasks_enqueued_total{{queue="{queue}"}}', "task") == {
        ("ok",): 5, ("fail",): 1}
    assert prom.values(f'obsq_queue_depth{{queue="{queue}"}}', "state") == {
        ("pending",): 0, ("active",): 0, ("scheduled",): 0, ("retry",): 0, ("dead",): 1,
        ("completed",): 0, ("cancelled",): 0, ("aggregating",): 0}
    assert prom.values("obsq_workers") == {(): 1}
    assert prom.values(f'obsq_queue_paused{{queue="{queue}"}}') == {(): 0}
    assert prom.values("obsq_worker_concurrency") == {(): 10}
    p50 = prom.values(f'histogram_quantile(0.5, sum by (le) '
                      f'(obsq_task_duration_seconds_bucket{{queue="{queue}"}}))')
    assert 0 < p50[()] <= 0.005
    assert prom.values(f'sum(obsq_task_wait_seconds_count{{queue="{queue}"}})') == {(): 7}

    trace_ids = {f"{s.context.trace_id:032x}" for s in spans.get_finished_spans()
                 if s.name == f"process {queue}"}
    now = time.time()
    series = prom.api("query_exemplars", query=f'obsq_task_duration_seconds_bucket'
                      f'{{queue="{queue}"}}', start=now - 600, end=now + 60)
    found = {e["labels"]["trace_id"] for s in series for e in s["exemplars"]}
    assert found and found <= trace_ids

    # The dashboards' latency queries (those that ask Grafana for exemplars) get them too.
    latency = [target["expr"] for path in sorted((ROOT / "dashboards").glob("*.json"))
               for panel in json.loads(path.read_text())["panels"]
               for target in panel.get("targets", []) if target.get("exemplar")]
    assert len(latency) >= 6
    for expr in latency:
        query = substitute(expr, {"queue": queue, "task": ".*"})
        series = prom.api("query_exemplars", query=query, start=now - 600, end=now + 60)
        found = {e["labels"]["trace_id"] for s in series for e in s["exemplars"]}
        assert found and found <= trace_ids, query
    await client.close()
