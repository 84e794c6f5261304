"""Bad input on every side: what producers pass, what sits in Redis, how a worker is
configured. Nothing bad may crash a worker or write half a task."""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support import ROOT, depth, missing_tool, one_clear_line, stop_process, wait_until

import obsq
from obsq.broker import QueueKeys
from obsq.engine.liveness import LIVENESS, READINESS, first_problem
from obsq.redis_server import RedisServer, free_port

from .helpers import namespace_keys


@pytest.mark.parametrize("call, error", [
    (lambda c: c.enqueue("t", {"when": object()}), TypeError),
    (lambda c: c.enqueue("t", {1, 2}), TypeError),
    (lambda c: c.enqueue("t", delay=-1), ValueError),
    (lambda c: c.enqueue("t", queue=""), ValueError),
    (lambda c: c.enqueue("t", queue="a{b}"), ValueError),
    (lambda c: c.enqueue(""), ValueError),
    (lambda c: c.enqueue("t", max_retry=-1), ValueError),
    (lambda c: c.enqueue("t", max_retry=1.5), ValueError),
    (lambda c: c.enqueue("t", timeout=0), ValueError),
    (lambda c: c.enqueue("t", retention=-5), ValueError),
    (lambda c: c.enqueue("t", unique_for=-5), ValueError),
    (lambda c: c.enqueue("t", task_id=""), ValueError),
    (lambda c: c.enqueue("t", delay=1, eta=datetime.datetime.now()), ValueError),
    (lambda c: c.enqueue("t", headers={"k": 1}), TypeError),
    # one bad job spoils the batch: nothing of it is written
    (lambda c: c.enqueue_many([obsq.Job("t", 1), obsq.Job("t", object())]), TypeError),
    (lambda c: c.enqueue_many([obsq.Job("t", 1, queue="q"), obsq.Job("t", delay=-1)]),
     ValueError),
])
async def test_bad_enqueue_is_rejected_before_anything_is_written(client, raw_redis,
                                                                  namespace, call,
                                                                  error) -> None:
    with pytest.raises(error):
        await call(client)
    assert namespace_keys(raw_redis, namespace) == []


async def test_a_tampered_payload_goes_to_dead_while_others_run(app, client, start_worker,
                                                                raw_redis,
                                                                namespace) -> None:
    ran: list[object] = []

    @app.task("t")
    async def handler(task: obsq.Task):
        ran.append(task.payload)

    bad = await client.enqueue("t", {"ok": False}, max_retry=5)
    raw_redis.hset(QueueKeys(namespace, "default").task(bad.id), "payload", b"\x00not json{")
    await client.enqueue("t", {"ok": True})
    await start_worker()
    await wait_until(lambda: ran == [{"ok": True}])
    dead = await wait_until(lambda: _in_state(client, bad.id, "dead"))
    assert dead.error.startswith("PayloadError: payload of task")
    assert dead.retry_count == 0  # retrying cannot help a payload that does not decode
    await client.enqueue("t", "after")
    await wait_until(lambda: "after" in ran)


async def test_an_unknown_task_type_spends_no_retry(app, client, client_without_app,
                                                    start_worker) -> None:
    """A worker with no handler for a type (enqueued by a producer without its App) hands
    its tasks on (tests/engine/test_rolling_deploys.py has the rest); one it knows runs
    beside them."""
    @app.task("known")
    async def known(task: obsq.Task):
        return "ok"

    await start_worker()
    info = await client_without_app.enqueue("unknown:type", max_retry=1, retention=60)
    handed_on = await wait_until(lambda: _in_state(client, info.id, "scheduled"))
    assert handed_on.error == "UnknownTaskType: no handler is registered for task type " \
                              "'unknown:type'"
    assert handed_on.retry_count == 0
    known_info = await client.enqueue("known", retention=60)
    assert await client.result(known_info, timeout=5) == "ok"
    assert (await client.info(info.id)).retry_count == 0


async def test_a_type_the_apps_client_cannot_run_is_refused_before_anything_is_written(
        app, client, redis_url, raw_redis, namespace) -> None:
    """A typo would otherwise wait a day handed on (a flow's step with it, the flow
    running) or wait in its group for good: a Client with the App refuses it whole, in a
    single enqueue, a batch, a flow, a grouped enqueue and the SyncClient's enqueues,
    naming each type and the closest registered one; its refusal hooks hear of it."""
    @app.task("known")
    async def known(task: obsq.Task):
        pass

    @app.task("report:")
    async def report(task: obsq.Task):
        pass

    app.aggregate("ingest", lambda group, tasks: ("known", len(tasks)), max_size=10)
    refused: list[tuple[str, str]] = []
    client.on_refusal(lambda job, error: refused.append((job.type, type(error).__name__)))

    with pytest.raises(obsq.UnknownTaskType) as single:
        await client.enqueue("knwon", 1)
    assert str(single.value) == ("task type 'knwon' (did you mean 'known'?) has no handler "
                                 "(app.task) in the App of this Client: nothing was enqueued")
    assert isinstance(single.value, ValueError)
    with pytest.raises(obsq.UnknownTaskType, match=r"task types 'reprot:pdf' \(did you mean "
                       r"'report:pdf'\?\), 'zebra' and 'knwon' \(did you mean 'known'\?\) "
                       r"have no handler"):
        await client.enqueue_many([obsq.Job("known", 1), obsq.Job("reprot:pdf", 2),
                                   obsq.Job("report:csv", 3), obsq.Job("zebra", 4),
                                   obsq.Job("knwon", 5), obsq.Job("zebra", 6)])
    with pytest.raises(obsq.UnknownTaskType, match=r"'knwon' .* no handler"):
        await client.enqueue(obsq.chain(obsq.Job("known"), obsq.Job("knwon")))
    with pytest.raises(obsq.UnknownTaskType, match=r"'ingets' .*did you mean 'ingest'.* no "
                       r"aggregator \(app.aggregate\)"):
        await client.enqueue("ingets", 1, group="g")
    with obsq.SyncClient(redis_url, namespace, app=app) as sync, \
            pytest.raises(obsq.UnknownTaskType, match="'knwon'"):
        sync.enqueue("knwon", 1)
    assert namespace_keys(raw_redis, namespace) == []
    assert refused == [("knwon", "UnknownTaskType"), ("reprot:pdf", "UnknownTaskType"),
                       ("zebra", "UnknownTaskType"), ("knwon", "UnknownTaskType"),
                       ("zebra", "UnknownTaskType"), ("knwon", "UnknownTaskType"),
                       ("ingets", "UnknownTaskType")]

    # what the App routes, by a prefix too, and what its aggregators cover is enqueued
    await client.enqueue_many([obsq.Job("known", 1), obsq.Job("report:pdf", 2)])
    await client.enqueue("ingest", 1, group="g")
    await client.enqueue(obsq.chain(obsq.Job("known"), obsq.Job("report:csv")))


async def test_the_scheduler_and_the_aggregator_are_refused_a_type_their_app_cannot_run(
        app, client, start_worker, start_scheduler, raw_redis, namespace, caplog) -> None:
    """They enqueue through a Client of their App: a schedule entry's fire is logged as not
    enqueued, an aggregator's task fails its batch (tried again later); nothing is
    written."""
    caplog.set_level(logging.INFO, "obsq")

    @app.task("fine")
    async def fine(task: obsq.Task):
        pass

    app.periodic("@every 0.2s", "fnie")
    app.aggregate("ingest", lambda group, tasks: ("fnie", len(tasks)), max_size=2)
    for n in range(2):
        await client.enqueue("ingest", n, group="g")
    await start_worker()
    await start_scheduler()
    await wait_until(lambda: any(
        "schedule fnie: the fire of" in m and "was not enqueued: task type 'fnie' (did you "
        "mean 'fine'?) has no handler" in m for m in caplog.messages))
    await wait_until(lambda: any(
        "aggregator of 'ingest' failed for group 'g'" in m and "UnknownTaskType: task type "
        "'fnie'" in m for m in caplog.messages))
    assert [k for k in raw_redis.scan_iter(f"{namespace}:{{default}}:t:*")
            if raw_redis.hget(k, "type") == b"fnie"] == []


async def test_only_the_app_that_runs_handlers_refuses_types(app, client, client_without_app,
                                                             redis_url, namespace) -> None:
    """A Client without an App, or with an App of no handler (a producer's: its namespace
    and hooks), enqueues any type; an App routing '*' runs every type."""
    await client.enqueue("anything", 1)  # the test's App has no handler yet
    await client_without_app.enqueue("anything", 1)
    with obsq.SyncClient(redis_url, namespace) as sync:
        sync.enqueue("anything", 1)

    @app.task("*")
    async def every(task: obsq.Task):
        pass

    await client.enqueue_many([obsq.Job("anything", 1), obsq.Job("else", 2)])


@pytest.mark.parametrize("task_type", ["", None])
async def test_a_bad_task_type_is_refused_before_its_handler_is_looked_for(
        app, client, caplog, task_type) -> None:
    @app.task("known")
    async def known(task: obsq.Task):
        pass

    for group in (None, "g"):
        with pytest.raises(ValueError) as refused:
            await client.enqueue(task_type, 1, group=group)
        assert not isinstance(refused.value, obsq.UnknownTaskType)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_result_that_is_not_json_never_runs_the_handler_again(
        app, client, start_worker, broker, caplog) -> None:
    """The handler did its work (an email sent, a card charged): a result that cannot be
    kept is no reason to run it again. Asked to keep it, the task ends dead at once with
    the reason; otherwise the result is dropped with one warning per type."""
    runs: list[str] = []

    @app.task("weird")
    async def weird(task: obsq.Task):
        runs.append(task.id)
        return b"bytes, not JSON"

    await start_worker()
    kept = await client.enqueue("weird", retention=60)  # the default: 25 retries
    with pytest.raises(obsq.TaskFailed, match="not JSON-serializable"):
        await client.result(kept, timeout=10)
    dead = await client.info(kept.id)
    assert dead.state == "dead" and dead.retry_count == 0
    assert dead.error.startswith("SkipRetry: the result of task type 'weird' is not JSON")
    dropped = [await client.enqueue("weird") for _ in range(3)]
    await wait_until(lambda: _settled(broker))
    assert runs == [kept.id, *(i.id for i in dropped)]  # each handler ran once
    assert sum("it is not kept" in r.getMessage() for r in caplog.records) == 1


async def test_a_task_hash_deleted_behind_obsqs_back_is_skipped(app, client, start_worker,
                                                                raw_redis,
                                                                namespace) -> None:
    ran: list[object] = []

    @app.task("t")
    async def handler(task: obsq.Task):
        ran.append(task.payload)

    ghost = await client.enqueue("t", "ghost")
    await client.enqueue("t", "real")
    raw_redis.delete(QueueKeys(namespace, "default").task(ghost.id))
    assert raw_redis.llen(QueueKeys(namespace, "default").pending) == 2
    await start_worker()
    await wait_until(lambda: ran == ["real"])
    assert raw_redis.llen(QueueKeys(namespace, "default").pending) == 0
    assert not raw_redis.zscore(QueueKeys(namespace, "default").lease, ghost.id)
    await client.enqueue("t", "after")
    await wait_until(lambda: ran == ["real", "after"])


@pytest.mark.parametrize("field, junk", [
    ("opts", b"{not json"), ("opts", b"[1, 2]"), ("opts", b'{"max_retry": "x", "timeout": -1}'),
    ("headers", b"\xff\xfe"), ("headers", b"[]"),
])
async def test_garbage_in_stored_fields_falls_back_to_defaults(app, client, start_worker,
                                                               raw_redis, namespace, field,
                                                               junk) -> None:
    seen: list[tuple] = []

    @app.task("t", max_retry=3)
    async def handler(task: obsq.Task):
        seen.append((task.max_retry, task.timeout, task.headers, task.payload))
        return "fine"

    info = await client.enqueue("t", "p", timeout=9, max_retry=1, headers={"h": "v"})
    raw_redis.hset(QueueKeys(namespace, "default").task(info.id), field, junk)
    stored = await client.info(info.id)  # info() can show the task
    assert (stored.state, stored.payload) == ("pending", "p")
    await start_worker()
    await wait_until(lambda: seen)
    if field == "opts":  # the route's max_retry, the default timeout
        assert seen == [(3, obsq.engine.execution.DEFAULT_TIMEOUT, {"h": "v"}, "p")]
    else:
        assert seen == [(1, 9, {}, "p")]
    await wait_until(lambda: not raw_redis.exists(QueueKeys(namespace, "default").task(info.id)))


async def test_garbage_in_the_retry_count_does_not_stop_the_worker(app, client, start_worker,
                                                                  raw_redis,
                                                                  namespace) -> None:
    ran: list[object] = []

    @app.task("t")
    async def handler(task: obsq.Task):
        ran.append((task.payload, task.retry_count))

    info = await client.enqueue("t", "odd")
    raw_redis.hset(QueueKeys(namespace, "default").task(info.id), "retried", b"lots")
    await start_worker()
    await client.enqueue("t", "next")
    await wait_until(lambda: ("next", 0) in ran)
    await wait_until(lambda: [p for p, _ in ran].count("odd") == 1)


# -- worker configuration -----------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {"concurrency": 0},
    {"concurrency": -3},
    {"queues": ""},
    {"queues": "default=0"},
    {"queues": "default=x"},
    {"queues": "bad{name}=1"},
    {"queues": {"default": -1}},
    {"lease_seconds": 0},
    {"shutdown_timeout": -1},
    {"max_recoveries": -1},
    {"namespace": "a{b}"},
    {"redis_url": "nonsense"},
    {"redis_url": "http://localhost:6379"},
])
def test_worker_with_bad_options_raises_configuration_error(app, options) -> None:
    with pytest.raises(obsq.ConfigurationError):
        obsq.Worker(app, **{"redis_url": "redis://127.0.0.1:6379/0", **options})


async def test_a_worker_started_before_its_redis_waits_for_it(
        app, namespace, caplog: pytest.LogCaptureFixture) -> None:
    """Pods started together: the worker tries again with backoff, saying each try, alive
    and not ready meanwhile, and serves once Redis is up (it exited at once, so Kubernetes
    put it into a crash-loop back-off)."""
    ran: list[int] = []

    @app.task("job")
    async def job(task: obsq.Task) -> None:
        ran.append(task.payload)

    server = RedisServer()  # its port chosen, nothing listening yet
    worker = obsq.Worker(app, redis_url=server.url, namespace=namespace, handle_signals=False)
    with caplog.at_level(logging.WARNING, logger="obsq"):
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: "(try 2)" in caplog.text, what="two tries said")
    health = worker.health()
    assert not health.started and not running.done()
    assert first_problem(health, LIVENESS) is None  # alive: a restart would not help
    assert first_problem(health, READINESS) is not None  # not ready: nothing is served
    assert "cannot reach Redis yet (try 1)" in caplog.text
    server.start()
    try:
        await wait_until(worker.started.is_set, what="the worker serving once Redis is up")
        async with obsq.Client(server.url, namespace) as client:
            await client.enqueue("job", 7)
            await wait_until(lambda: ran == [7])
        worker.stop()
        await asyncio.wait_for(running, 30)
    finally:
        server.close()


async def test_a_worker_stopped_while_it_waits_for_redis_says_so(app) -> None:
    worker = obsq.Worker(app, redis_url=f"redis://127.0.0.1:{free_port()}/0",
                         handle_signals=False)
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)
    worker.stop()
    with pytest.raises(obsq.StartupError, match="stopped before Redis could be reached"):
        await asyncio.wait_for(running, timeout=20)


async def test_a_wrong_password_still_fails_a_worker_at_once(app) -> None:
    server = RedisServer(config={"requirepass": "s3"}).start()
    try:
        worker = obsq.Worker(app, redis_url=server.url, handle_signals=False)
        with pytest.raises(obsq.StartupError, match="requires a password"):
            await asyncio.wait_for(worker.run(), timeout=20)
    finally:
        server.close()


async def test_a_client_against_an_unreachable_redis_says_where_and_why() -> None:
    """Its first call reads the memory policy: named by the URL, not the operation."""
    port = free_port()
    async with obsq.Client(f"redis://me:secret@127.0.0.1:{port}/0") as client:
        with pytest.raises(obsq.BrokerError) as raised:
            await client.enqueue("echo")
    assert str(raised.value) == (f"cannot reach Redis at redis://***@127.0.0.1:{port}/0: "
                                 "Connection refused")


async def test_a_client_whose_redis_goes_away_says_where_and_which_call() -> None:
    server = RedisServer().start()
    try:
        async with obsq.Client(server.url) as client:
            await client.enqueue("echo")
            server.close()
            with pytest.raises(obsq.BrokerError) as raised:
                await client.enqueue("echo")
    finally:
        server.close()
    assert str(raised.value).startswith(
        f"Redis call 'enqueue' failed: cannot reach Redis at {server.url}: ")


def _run_worker_cli(redis_url: str, *extra: str,
                    app: str = "tests.engine.apps:app") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obsq", "worker", app, "--redis-url", redis_url,
         "--http-port", "0", "--no-metrics", "--no-tracing", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [("worker", "--no-metrics", "--no-tracing"),
                                     ("scheduler",)])
def test_the_cli_waits_for_an_unreachable_redis_until_it_is_stopped(command) -> None:
    """A worker or a scheduler started before Redis (pods started together) waits for it,
    each try said, and a stop ends the wait with one line."""
    name, *flags = command
    process = subprocess.Popen(
        [sys.executable, "-m", "obsq", name, "tests.engine.apps:app", "--redis-url",
         f"redis://127.0.0.1:{free_port()}/0", "--http-port", "0", *flags], cwd=ROOT,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert process.stderr is not None
    lines: list[str] = []
    for line in process.stderr:  # each try is said
        lines.append(line)
        if "(try 2)" in line:
            break
    assert stop_process(process) == 1
    lines += process.stderr.read().splitlines()
    assert any("cannot reach Redis yet (try 1)" in line and "127.0.0.1" in line
               for line in lines), lines
    assert "stopped before Redis could be reached" in lines[-1], lines
    assert "Traceback" not in "".join(lines)


def test_worker_cli_exits_with_one_line_for_a_malformed_url() -> None:
    one_clear_line(_run_worker_cli("nonsense"), "nonsense", "not a URL")


@pytest.mark.parametrize("extra, app, expected", [
    (("--queues", "bad{name}=1"), "tests.engine.apps:app", "bad{name}"),
    (("--queues", "default=zero"), "tests.engine.apps:app", "not an integer"),
    (("--concurrency", "0"), "tests.engine.apps:app", "concurrency"),
    ((), "tests.engine.no_such_module:app", "cannot import"),
    ((), "tests.engine.apps:nothing", "has no attribute 'nothing'"),
    ((), "tests.engine.apps:recorder", "is not an obsq.App (found function)"),
    ((), "tests.engine.apps", "MODULE:APP"),
])
def test_worker_cli_exits_with_one_line_for_bad_options(redis_url, extra, app,
                                                        expected) -> None:
    one_clear_line(_run_worker_cli(redis_url, *extra, app=app), expected)


@pytest.fixture
def redis_with_password() -> Iterator[tuple[int, str]]:
    if not shutil.which("redis-server"):
        missing_tool("redis-server is not on PATH")
    server = RedisServer(config={"requirepass": "s3cret"}).start()
    try:
        yield server.port, "s3cret"
    finally:
        server.close()


def test_worker_cli_exits_with_one_line_for_a_wrong_password(redis_with_password) -> None:
    port, _ = redis_with_password
    line = one_clear_line(_run_worker_cli(f"redis://:wrong@127.0.0.1:{port}/0"),
                           "refused the credentials")
    assert "wrong" not in line  # the password is not printed
    one_clear_line(_run_worker_cli(f"redis://127.0.0.1:{port}/0"),
                   "requires a password, and the URL gives none")


async def test_the_start_line_hides_the_password(redis_with_password, start_worker,
                                                 caplog) -> None:
    port, password = redis_with_password
    caplog.set_level(logging.INFO, logger="obsq")
    await start_worker(redis_url=f"redis://:{password}@127.0.0.1:{port}/0")
    started = [r.getMessage() for r in caplog.records if "started: queues" in r.getMessage()]
    assert started and started[0].endswith(f"Redis redis://***@127.0.0.1:{port}/0")


async def _settled(broker) -> bool:
    """Nothing of the queue waits, runs or retries."""
    counts = await depth(broker)
    return counts["pending"] == counts["active"] == counts["retry"] == 0


async def _in_state(client: obsq.Client, task_id: str, state: str) -> obsq.TaskInfo | None:
    info = await client.info(task_id)
    return info if info.state == state else None



@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_taken_http_port_is_one_line(redis_url, command) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "obsq", command, "tests.engine.apps:app", "--redis-url",
             redis_url, "--http-port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    one_clear_line(result, f"cannot serve HTTP on 0.0.0.0:{port}", "--http-port")
