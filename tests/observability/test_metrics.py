"""A real worker's /metrics after a scripted mix of tasks: every figure of the contract,
checked exactly, and the exposition linted by promtool."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

from support import wait_until

import obsq
from obsq import __version__
from obsq.broker import Broker, GlobalKeys, QueueKeys
from obsq.observability import instrument_client
from obsq.settings import DEFAULT_TIMEOUT

from .helpers import OPENMETRICS, http_get, missing_tool, parse, pick, scrape, value


async def test_scrape_after_a_scripted_mix(app, redis_url, namespace, raw_redis, start_worker):
    main, paused, elsewhere = f"main-{namespace}", f"paused-{namespace}", f"away-{namespace}"
    release = asyncio.Event()
    slow_attempts = []

    @app.task("flaky", queue=main, retry_delay=0)
    async def flaky(task):
        if task.retry_count < 2:
            raise ConnectionError("not yet")
        return "ok"

    @app.task("doomed", queue=main, max_retry=2, retry_delay=0)
    async def doomed(task):
        raise ValueError("never")

    @app.task("easy", queue=main)
    def easy(task):
        return task.payload

    @app.task("later", queue=main, retry_delay=3600)
    async def later(task):
        raise RuntimeError("tomorrow")

    @app.task("slow:", queue=main)  # a prefix route: its pattern is the label
    async def slow(task):
        slow_attempts.append(task._attempt.fence)
        if len(slow_attempts) == 1:
            await release.wait()  # meanwhile its lease is taken over
        return "done"

    admin = Broker(redis_url, namespace)
    await admin.register_queues([main, paused])
    await admin.set_paused(paused, True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)  # instrumented
    worker = await start_worker(queues={main: 1, paused: 1}, metrics=True, http_port=0,
                                lease_seconds=60, concurrency=10,
                                unknown_type_max_age=0.001)  # dead at its second hand-on
    port = start_worker.port(worker)

    await client.enqueue("flaky", {})
    await client.enqueue("doomed", {})
    for i in range(3):
        await client.enqueue("easy", {"i": i}, retention=600)
    # no route: handed on; enqueued by a producer without the App, as the App's refuses it
    stranger = instrument_client(obsq.Client(redis_url, namespace=namespace))
    await stranger.enqueue("mystery", {}, queue=main, max_retry=0)
    await stranger.close()
    await client.enqueue("later", {})
    await client.enqueue("easy", {"i": 9}, delay=3600)  # stays scheduled
    jobs = [obsq.Job("easy", {"dup": 1}, task_id=f"dup-{namespace}", delay=3600)] * 2
    infos = await client.enqueue_many(jobs)  # the second is a duplicate: not counted
    assert [i.duplicate for i in infos] == [False, True]
    for i in range(2):
        await client.enqueue("easy", {"p": i}, queue=paused)
    first = await client.enqueue("slow:job", {})

    # The first slow attempt runs; expire its lease so the recoverer takes it back.
    await wait_until(lambda: len(slow_attempts) == 1, what="the slow task started")
    raw_redis.zadd(QueueKeys(namespace, main).lease, {first.id: 1})
    await wait_until(lambda: len(slow_attempts) == 2, what="the task ran again")

    # A task held by a worker that stopped heartbeating, in a queue nobody serves.
    lost = await client.enqueue("easy", {}, queue=elsewhere)
    _, fetched = await admin.dequeue(elsewhere, 1, "ghost", 60)
    taken = fetched.tasks
    assert [t[0] for t in taken] == [lost.id]
    raw_redis.zadd(GlobalKeys(namespace).workers, {"ghost": int((time.time() - 60) * 1000)})

    # The paused queue's oldest task has been due for 100 s.
    oldest = raw_redis.lindex(QueueKeys(namespace, paused).pending, -1).decode()
    raw_redis.hset(QueueKeys(namespace, paused).task(oldest), "due",
                   int((time.time() - 100) * 1000))

    outcomes = {("flaky", "retry"): 2, ("flaky", "success"): 1, ("doomed", "retry"): 2,
                ("doomed", "dead"): 1, ("easy", "success"): 3,
                ("later", "retry"): 1, ("slow:", "success"): 1}

    def settled():
        s = parse(scrape(port))
        return all(value(s, "obsq_tasks_processed_total", queue=main, task=t, outcome=o) == n
                   for (t, o), n in outcomes.items()) and value(
            s, "obsq_lease_recoveries_total", queue=elsewhere, reason="worker_lost") == 1 \
            and value(s, "obsq_tasks_unknown_type_total", queue=main, outcome="dead") == 1
    await wait_until(lambda: asyncio.to_thread(settled), timeout=20, what="all outcomes")
    release.set()  # the first slow attempt ends: its result is refused
    outcomes[("slow:", "lease_lost")] = 1
    await wait_until(lambda: asyncio.to_thread(
        lambda: value(parse(scrape(port)), "obsq_tasks_processed_total", queue=main,
                      task="slow:", outcome="lease_lost") == 1), what="lease_lost counted")
    await asyncio.sleep(1.1)  # past the queue gauges' cache

    text = await asyncio.to_thread(scrape, port)
    s = parse(text)
    counted = {k: v for k, v in pick(s, "obsq_tasks_processed_total", queue=main).items() if v}
    assert counted == {
        (("outcome", o), ("queue", main), ("task", t)): n for (t, o), n in outcomes.items()}
    assert pick(s, "obsq_tasks_processed_total", queue=paused) == {}
    assert {k: v for k, v in pick(s, "obsq_tasks_enqueued_total", queue=main).items() if v} == {
        (("queue", main), ("task", t)): n for t, n in
        {"flaky": 1, "doomed": 1, "easy": 5, "other": 1, "later": 1, "slow:": 1}.items()}
    assert value(s, "obsq_tasks_enqueued_total", queue=paused, task="easy") == 2
    assert value(s, "obsq_tasks_enqueued_total", queue=elsewhere, task="easy") == 1
    runs = {"flaky": 3, "doomed": 3, "easy": 3, "later": 1, "slow:": 2}
    for name in ("obsq_task_duration_seconds", "obsq_task_wait_seconds"):
        assert {dict(k)["task"]: v for k, v in pick(s, name + "_count", queue=main).items()
                } == runs
        infinite = pick(s, name + "_bucket", queue=main, le="+Inf")
        assert {dict(k)["task"]: v for k, v in infinite.items()} == runs
        buckets = {dict(k)["le"] for k in pick(s, name + "_bucket", queue=main, task="easy")}
        assert {"0.005", "600.0", "+Inf"} <= buckets
        # a handler near the default timeout lands in a bucket of its own, not in +Inf
        assert max(float(b) for b in buckets - {"+Inf"}) > DEFAULT_TIMEOUT
    assert value(s, "obsq_task_duration_seconds_sum", queue=main, task="slow:") > 0
    assert all(v == 0 for v in pick(s, "obsq_tasks_in_progress", queue=main).values())
    assert pick(s, "obsq_tasks_in_progress", queue=main)  # the series exist
    assert value(s, "obsq_lease_recoveries_total", queue=main, reason="expired") == 1
    assert value(s, "obsq_tasks_unknown_type_total", queue=main, outcome="handed_on") == 1
    assert value(s, "obsq_lease_recoveries_total", queue=elsewhere, reason="worker_lost") == 1
    assert value(s, "obsq_worker_concurrency") == 10
    assert value(s, "obsq_build_info", version=__version__) == 1
    assert value(s, "obsq_workers") == 1  # the ghost does not count
    depth = {dict(k)["state"]: v for k, v in pick(s, "obsq_queue_depth", queue=main).items()}
    assert depth == {"pending": 0, "active": 0, "scheduled": 2, "retry": 1, "dead": 2,
                     "completed": 3, "cancelled": 0, "aggregating": 0}
    depth = {dict(k)["state"]: v for k, v in pick(s, "obsq_queue_depth", queue=paused).items()}
    assert depth == {"pending": 2, "active": 0, "scheduled": 0, "retry": 0, "dead": 0,
                     "completed": 0, "cancelled": 0, "aggregating": 0}
    assert pick(s, "obsq_queue_depth", queue=elsewhere) == {}  # not this worker's queue
    assert value(s, "obsq_queue_paused", queue=paused) == 1
    assert value(s, "obsq_queue_paused", queue=main) == 0
    assert value(s, "obsq_queue_latency_seconds", queue=main) == 0
    assert 100 <= value(s, "obsq_queue_latency_seconds", queue=paused) < 110
    for line in text.splitlines():  # bounded labels only: no ids or payloads
        assert first.id not in line and "dup-" not in line and "tomorrow" not in line

    promtool = shutil.which("promtool")
    if promtool is None:
        missing_tool("promtool is not on PATH (apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    await client.close()
    await admin.close()


async def test_second_worker_on_the_same_app_does_not_double_count(app, redis_url, namespace,
                                                                    start_worker):
    queue = f"twice-{namespace}"

    @app.task("one", queue=queue)
    async def one(task):
        return None

    first = await start_worker(queues={queue: 1}, metrics=True, tracing=True, http_port=0)
    await start_worker(queues={queue: 1}, metrics=True, tracing=True)
    assert app.middleware.count(app.middleware[0]) == 1 and len(app.middleware) == 2
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    instrument_client(client)  # again: nothing more
    assert (len(app.producer_hooks), client.hooks) == (2, [])  # from the App, once
    for _ in range(20):
        await client.enqueue("one")

    def counted():
        s = parse(scrape(start_worker.port(first)))
        return value(s, "obsq_tasks_processed_total", queue=queue, task="one",
                     outcome="success") == 20 and s
    s = await wait_until(lambda: asyncio.to_thread(counted), what="20 successes")
    assert value(s, "obsq_tasks_enqueued_total", queue=queue, task="one") == 20
    assert value(s, "obsq_task_duration_seconds_count", queue=queue, task="one") == 20
    await client.close()


async def test_openmetrics_scrape_carries_trace_id_exemplars(app, redis_url, namespace, spans,
                                                            start_worker):
    queue = f"ex-{namespace}"

    @app.task("traced", queue=queue)
    async def traced(task):
        await asyncio.sleep(0.01)

    worker = await start_worker(queues={queue: 1}, metrics=True, tracing=True, http_port=0)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    await client.enqueue("traced")
    await wait_until(lambda: [s for s in spans.get_finished_spans()
                              if s.name == f"process {queue}"], what="the process span")
    process = next(s for s in spans.get_finished_spans() if s.name == f"process {queue}")
    trace_id = format(process.context.trace_id, "032x")
    port = start_worker.port(worker)
    status, body, headers = await asyncio.to_thread(http_get, port, "/metrics",
                                                    accept=OPENMETRICS)
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.rstrip().endswith("# EOF")
    exemplars = [line for line in text.splitlines()
                 if line.startswith(("obsq_task_duration_seconds_bucket",
                                     "obsq_task_wait_seconds_bucket"))
                 and f'queue="{queue}"' in line and " # {" in line]
    assert len(exemplars) == 2
    assert all(f'# {{trace_id="{trace_id}"}}' in line for line in exemplars)
    plain = await asyncio.to_thread(scrape, port)  # the text format has none
    assert "trace_id" not in plain
    await client.close()


async def test_known_series_are_exported_at_zero_from_the_start(app, redis_url, namespace,
                                                                start_worker):
    queue = f"q-{namespace}"

    @app.task("quiet", queue=queue)
    async def quiet(task):
        return None

    worker = await start_worker(queues={queue: 1}, metrics=True, http_port=0)
    port = start_worker.port(worker)
    s = parse(await asyncio.to_thread(scrape, port))  # before any task or error

    def exported(name: str, **labels: str) -> float | None:
        return s.get((name, tuple(sorted(labels.items()))))

    for outcome in obsq.app.OUTCOMES:
        assert exported("obsq_tasks_processed_total", queue=queue, task="quiet",
                        outcome=outcome) == 0
    for reason in ("expired", "worker_lost"):
        assert exported("obsq_lease_recoveries_total", queue=queue, reason=reason) == 0
    for outcome in ("handed_on", "dead"):
        assert exported("obsq_tasks_unknown_type_total", queue=queue, outcome=outcome) == 0
    for operation in ("ack", "dequeue", "heartbeat", "wait_for_work"):  # process-wide: other
        assert exported("obsq_redis_errors_total", operation=operation) is not None  # tests
    assert exported("obsq_task_duration_seconds_count", queue=queue, task="quiet") == 0


async def test_held_back_starts_are_counted_by_reason(app, client, redis_url, namespace,
                                                      start_worker):
    queue = f"held-{namespace}"

    @app.task("paced", queue=queue, rate_limit="20/s")
    async def paced(task):
        return None

    @app.task("ordered", queue=queue)
    async def ordered(task):
        await asyncio.sleep(0.01)

    worker = await start_worker(queues={queue: 1}, metrics=True, http_port=0)
    port = start_worker.port(worker)
    await client.enqueue_many([obsq.Job("paced", i) for i in range(10)]
                              + [obsq.Job("ordered", i, ordering_key="k") for i in range(3)])

    def throttled(task: str, reason: str) -> float:
        return value(parse(scrape(port)), "obsq_tasks_throttled_total", queue=queue, task=task,
                     reason=reason)
    # the first two start at once (a burst of two), the other eight wait for their time
    await wait_until(lambda: asyncio.to_thread(lambda: throttled("paced", "rate") == 8))
    # the second and third waited for the one ahead of them on the key
    await wait_until(lambda: asyncio.to_thread(lambda: throttled("ordered", "ordering") == 2))


async def test_a_task_held_back_is_counted_once(app, client, namespace, start_worker):
    """The forwarder lets the longest-held task out every tick to look at its limit again
    (in case a dead worker's slot never comes back); held again, it is not a new count."""
    queue = f"gate-{namespace}"
    release = asyncio.Event()

    @app.task("gated", queue=queue, concurrency=1)
    async def gated(task):
        if task.payload == "hold":
            await release.wait()

    worker = await start_worker(queues={queue: 4}, metrics=True, http_port=0)
    port = start_worker.port(worker)
    await client.enqueue("gated", "hold")
    await client.enqueue("gated", "quick")

    def throttled() -> float:
        return value(parse(scrape(port)), "obsq_tasks_throttled_total", queue=queue,
                     task="gated", reason="concurrency")
    await wait_until(lambda: asyncio.to_thread(lambda: throttled() == 1))
    await asyncio.sleep(20 * worker.settings.forward_interval)  # let out and held again
    assert await asyncio.to_thread(throttled) == 1
    release.set()


async def test_expired_tasks_and_retries_past_expiry_are_counted(app, client, namespace,
                                                                 start_worker):
    queue = f"expiring-{namespace}"

    @app.task("stale", queue=queue)
    async def stale(task):
        return None

    @app.task("failing", queue=queue, retry_delay=5)
    async def failing(task):
        raise ValueError("down")

    await client.enqueue_many([obsq.Job("stale", i, expires=0.05) for i in range(3)])
    await asyncio.sleep(0.1)
    worker = await start_worker(queues={queue: 1}, metrics=True, http_port=0)
    port = start_worker.port(worker)
    await client.enqueue("failing", expires=2)  # its retry, due in 5 s, is past it

    def counted(task: str, outcome: str) -> float:
        return value(parse(scrape(port)), "obsq_tasks_processed_total", queue=queue, task=task,
                     outcome=outcome)
    await wait_until(lambda: asyncio.to_thread(lambda: counted("stale", "expired") == 3))
    await wait_until(lambda: asyncio.to_thread(lambda: counted("failing", "expired") == 1))
    samples = parse(scrape(port))
    assert value(samples, "obsq_tasks_processed_total", queue=queue, task="failing",
                 outcome="retry") == 0
    for reason in ("tasks", "memory"):  # exported at 0 from the start
        assert ("obsq_worker_children_recycled_total", (("reason", reason),)) in samples
