"""Least privilege: the Redis ACL rule of `obsq acl --namespace NS` grants every command obsq
sends and every command its Lua scripts call (read here from the scripts and from the
broker's redis-py calls, independently of obsq.broker.acl), and nothing else; the engine's
work runs as a user restricted to it with no command denied (Redis's ACL LOG stays empty); a
user without it stops every process at start with one line, on Redis 6.2 too, and one
whose permission is taken away at run time is told so once, not retried as an outage; a
user denied INFO runs, with a warning."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Iterator

import pytest
import redis
from support import (
    ROOT,
    SHORT_INTERVALS,
    ObsqProcess,
    newest_redis_server,
    obsq_env,
    one_clear_line,
    redis_6_2_server,
    run_obsq,
    short_interval_env,
    wait_until,
)

import obsq
from obsq.broker.acl import (
    BROKER_COMMANDS,
    OPTIONAL_COMMANDS,
    UNGRANTED_COMMANDS,
    acl_rule,
    required_commands,
    script_commands,
)
from obsq.broker.startup import StartupChecks
from obsq.engine.scheduler import Scheduler
from obsq.redis_server import RedisServer
from obsq.settings import SchedulerSettings

SCRIPTS = ROOT / "obsq" / "broker" / "scripts"
CALL = re.compile(r"\b(redis\.p?call|call_sliced)\(([^,)]*)")
LITERAL = re.compile(r"""\s*(['"])([A-Za-z]+)\1\s*$""")
# The broker's redis-py calls: a method of its client or of a pipeline, or a command sent by
# name (a container command with its subcommand).
METHOD = re.compile(r"\b(?:redis|pipe)\.(\w+)\(")
BY_NAME = re.compile(
    r"""(?:execute_command|send_command|pack_command)\(\(?"([A-Z]+)"(?:, "([A-Z]+)")?""")
NOT_COMMANDS = {"pipeline", "execute", "aclose", "close", "execute_command", "get_default_node"}
RENAMED = {"scan_iter": "scan", "config_get": "config|get", "script_load": "script|load",
           "delete": "del"}


def commands_of_the_scripts() -> set[str]:
    """Every command named in a call of the scripts; each call must name it literally."""
    found = set()
    for path in sorted(SCRIPTS.glob("*.lua")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("--") or "local function call_sliced" in line:
                continue
            for call, first in CALL.findall(line):
                literal = LITERAL.match(first)
                if literal is None:
                    assert (path.name, first.strip()) == ("_prelude.lua", "command"), (
                        f"{path.name}:{number}: {call} of a command that is not named "
                        f"literally ({line.strip()}): obsq acl cannot know it")
                    continue
                found.add(literal.group(2).lower())
    return found


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    """A Redis 7 (ACL DRYRUN, no-writes scripts) whose default user is the admin."""
    server = RedisServer(executable=newest_redis_server()).start()
    yield server
    server.close()


@pytest.fixture
def admin(acl_redis: RedisServer) -> Iterator[redis.Redis]:
    r = redis.Redis(port=acl_redis.port)
    yield r
    r.close()


def refusals(admin: redis.Redis, user: str, command: str) -> int:
    """How many times Redis refused `command` to `user` (its ACL LOG)."""
    return sum(entry["count"] for entry in admin.acl_log(count=100)
               if entry["username"] == user and entry["object"] == command)


def make_user(admin: redis.Redis, name: str, rules: str) -> str:
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rules.split())
    return f"redis://{name}:pw@127.0.0.1:{admin.connection_pool.connection_kwargs['port']}/0"


def dry_run(admin: redis.Redis, user: str, command: str, key: str) -> str:
    """ACL DRYRUN of `command` on `key` with as few arguments as its arity allows."""
    args: list[str] = []
    for _ in range(8):
        try:
            reply = admin.execute_command("ACL", "DRYRUN", user, *command.split("|"), *args)
        except redis.ResponseError as exc:
            if "wrong number of arguments" not in str(exc):
                return str(exc)
            args.append(key)
            continue
        return reply.decode() if isinstance(reply, bytes) else str(reply)
    return "no arity fits"


def commands_the_broker_sends() -> set[str]:
    """Every command of a redis-py call in obsq/broker, but for acl.py (whose probes send
    only what the rule lists: test_a_user_without_the_rule_is_one_line_at_start)."""
    found = set()
    for path in sorted((ROOT / "obsq" / "broker").glob("*.py")):
        if path.name != "acl.py":
            source = path.read_text()
            found |= {RENAMED.get(m, m) for m in METHOD.findall(source)} - NOT_COMMANDS
            found |= {"|".join(filter(None, c)).lower() for c in BY_NAME.findall(source)}
    return found


def test_the_rule_lists_every_command_the_broker_sends() -> None:
    found = commands_the_broker_sends()
    assert {"blpop", "hgetall", "scan", "wait", "script|load", "config|get", "hello"} <= found
    assert found == set(BROKER_COMMANDS) | set(UNGRANTED_COMMANDS)


def test_the_scripts_name_each_command_literally() -> None:
    found = commands_of_the_scripts()
    assert {"zpopmin", "hscan", "zscore", "zrevrange", "srem", "sadd", "time"} <= found
    assert script_commands() == found


def test_the_rule_grants_every_command_obsq_uses_and_nothing_else(admin, namespace) -> None:
    make_user(admin, "obsq-rule", acl_rule(namespace))
    key = f"{namespace}:{{q}}:k"
    needed = sorted(commands_of_the_scripts() | set(BROKER_COMMANDS))
    denied = {c: r for c in needed if (r := dry_run(admin, "obsq-rule", c, key)) != "OK"}
    assert denied == {}
    for command in ("flushall", "config|get", "keys", "acl|setuser", "eval", "publish"):
        assert dry_run(admin, "obsq-rule", command, key) != "OK", command
    assert "permissions" in dry_run(admin, "obsq-rule", "get", "othernamespace:k")


def test_obsq_acl_prints_the_rule(namespace) -> None:
    result = run_obsq("acl", "--namespace", namespace)
    assert result.returncode == 0, result.stderr
    assert result.stdout == acl_rule(namespace) + "\n"
    assert result.stdout.startswith(f"resetkeys ~{namespace}:* resetchannels -@all +")


async def test_the_engine_runs_as_a_user_restricted_to_the_rule(
        acl_redis, admin, namespace, start_worker, tmp_path, caplog) -> None:
    """Enqueue (unique, delayed, ordered, limited), run, retry, die, cancel, keep results and
    progress, lose a SIGKILLed worker and recover its task, fire schedules, inspect and
    repair: everything as the restricted user, with no command denied."""
    caplog.set_level(logging.WARNING, "obsq")
    url = make_user(admin, "obsq", acl_rule(namespace))
    admin.acl_log_reset()
    app = obsq.App(namespace=namespace)
    errors: list[str] = []
    app.on_redis_error(lambda operation, exc: errors.append(f"{operation}: {exc}"))
    attempts: dict[str, int] = {}

    @app.task("ok")
    async def ok(task: obsq.Task) -> object:
        await task.update_state({"step": 1})
        return task.payload

    @app.task("flaky", max_retry=3, retry_delay=0)
    async def flaky(task: obsq.Task) -> str:
        attempts[task.id] = attempts.get(task.id, 0) + 1
        if attempts[task.id] == 1:
            raise RuntimeError("once")
        return "fine"

    @app.task("doomed", max_retry=0)
    async def doomed(task: obsq.Task) -> None:
        raise ValueError("never")

    @app.task("limited", concurrency=1, rate_limit="50/s")
    async def limited(task: obsq.Task) -> None:
        await asyncio.sleep(0.05)

    @app.task("hold")
    async def hold(task: obsq.Task) -> None:
        await asyncio.sleep(60)

    app.periodic("@every 0.3s", "ok", "tick", name="ticker")
    await start_worker(app, redis_url=url)
    async with obsq.Client(url, app=app) as client:
        first = await client.enqueue("ok", {"n": 1}, retention=60, unique_for=60)
        with pytest.raises(obsq.DuplicateTask):
            await client.enqueue("ok", {"n": 1}, unique_for=60)
        assert await client.result(first, timeout=10) == {"n": 1}
        assert await client.result(await client.enqueue("flaky", retention=60),
                                   timeout=10) == "fine"
        dead = await client.enqueue("doomed")
        with pytest.raises(obsq.TaskFailed):
            await client.result(dead, timeout=10)
        jobs = [obsq.Job("limited", i, ordering_key="k" if i % 2 else None, delay=0.1 * (i % 3),
                         retention=60) for i in range(8)]
        limited_infos = await client.enqueue_many(jobs)
        held = await client.enqueue("hold")
        await wait_until(lambda: client.info(held.id), what="the held task")
        await wait_until(lambda: _state(client, held.id, "active"))
        assert await client.cancel(held.id) == "running"
        await wait_until(lambda: _state(client, held.id, "cancelled"))
        for info in limited_infos:
            await client.result(info, timeout=15)
        await client.schedule("runtime", "@every 0.3s", "ok", "runtime")

        # a worker SIGKILLed while running a task: the task is taken back and runs again
        env = obsq_env(OBSQ_ENGINE_RECORD_URL=f"redis://127.0.0.1:{acl_redis.port}/0",
                       OBSQ_ENGINE_RECORD_PREFIX=namespace, **short_interval_env())
        doomed_worker = ObsqProcess(
            ["worker", "tests.engine.apps:app", "--redis-url", url, "--namespace", namespace,
             "--queues", "lost", "--http-port", "-1", "--no-metrics", "--no-tracing"],
            env, ROOT, tmp_path / "killed-worker.log")
        try:
            # a type of the other App (tests.engine.apps): enqueued by a Client without this one
            async with obsq.Client(url, namespace) as other_apps_client:
                sleeper = await other_apps_client.enqueue("sleep", {"first": 60, "then": 0},
                                                          queue="lost", retention=60)
            await wait_until(lambda: _state(client, sleeper.id, "active"), timeout=30)
            doomed_worker.signal(signal.SIGKILL)
            doomed_worker.wait()
            rescuer = obsq.App(namespace=namespace)
            rescuer.task("sleep")(lambda task: "ran again")
            await start_worker(rescuer, redis_url=url, queues="lost")
            assert await client.result(sleeper, timeout=30) == "ran again"
        finally:
            doomed_worker.close()

        scheduler = Scheduler(app, url, handle_signals=False,
                              settings=SchedulerSettings(lock_ttl=1.0))
        running = asyncio.ensure_future(scheduler.run())
        try:
            async def both_fired() -> bool:
                return {s.name for s in await client.schedules() if s.fire_count} == {
                    "ticker", "runtime"}
            await wait_until(both_fired, what="fires of both entries")
        finally:
            scheduler.stop()
            await running
        assert await client.unschedule("runtime")

    inspector = obsq.Inspector(url, namespace)
    await inspector.check()
    assert {q.name for q in await inspector.queues()} >= {"default", "lost"}
    assert (await inspector.tasks("default", "completed")).tasks
    assert (await inspector.tasks("default", "pending")).tasks is not None
    assert (await inspector.task(first.id)).state == "completed"
    assert await inspector.workers()
    await inspector.pause("default")
    await inspector.unpause("default")
    assert (await inspector.requeue("default", "dead")).moved == 1
    await wait_until(lambda: _state(inspector, dead.id, "dead"))
    assert await inspector.purge("default", "dead") == 1
    await inspector.delete(first.id)
    await inspector.close()
    await asyncio.sleep(SHORT_INTERVALS["janitor_interval"] * 2)  # a sweep or two as well

    assert errors == []
    # Left out of the rule on purpose: CONFIG GET, tried once per process for
    # maxmemory-policy (INFO answers instead), and redis-py's optional handshake on a new
    # connection on newer servers (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), which it goes
    # without. Every other command went through.
    denied = [entry for entry in admin.acl_log()
              if entry["object"].split("|")[0] not in ("config", "client")]
    assert denied == [], denied
    assert not [m for m in caplog.messages if "NOPERM" in m or "can't run" in m]


async def _state(source: object, task_id: str, state: str) -> bool:
    info = await source.info(task_id) if isinstance(source, obsq.Client) else \
        await source.task(task_id)
    return info.state == state


@pytest.mark.parametrize("rules, says", [
    ("resetkeys ~{ns}:* -@all +@read +@write +info +evalsha +script|load -zpopmin",
     "may not run"),
    ("resetkeys ~elsewhere:* +@all", "scripts on the keys of namespace"),
    ("resetkeys ~{ns}:* -@all +info +@read +@write", "may not run"),
    ("{rule} -blpop", "may not run blpop"),  # none of these three can be called in a script
    ("{rule} -wait", "may not run wait"),
    ("{rule} -script|load", "may not run script|load"),
])
def test_a_user_without_the_rule_is_one_line_at_start(admin, namespace, rules, says) -> None:
    url = make_user(admin, f"partial-{namespace}",
                    rules.format(ns=namespace, rule=acl_rule(namespace)))
    for args in (["worker", "tests.engine.apps:app", "--http-port", "-1"],
                 ["scheduler", "tests.engine.schedule_apps:app", "--http-port", "-1"],
                 ["stats"]):
        line = one_clear_line(run_obsq(*args, "--redis-url", url, "--namespace", namespace),
                              says, f"obsq acl --namespace {namespace}")
        assert ":pw@" not in line


async def test_the_start_up_check_finds_each_command_of_the_rule_missing(admin, namespace
                                                                         ) -> None:
    """Each command, taken from the rule in turn, is named, whether a script calls it or
    the broker sends it itself (and so a script may not: BLPOP, WAIT, SCRIPT LOAD)."""
    missed = {}
    for command in sorted(set(required_commands()) - set(OPTIONAL_COMMANDS)):
        url = make_user(admin, "one-less", f"{acl_rule(namespace)} -{command}")
        calls = StartupChecks(url, namespace)
        try:
            await calls.check()
            missed[command] = "started"
        except obsq.ConfigurationError as exc:
            if command not in str(exc):
                missed[command] = str(exc)
        finally:
            await calls.close()
    assert missed == {}


@pytest.mark.parametrize("args, rule_without", [
    (["worker", "tests.engine.apps:app", "--http-port", "-1"], "evalsha"),
    (["stats"], "smembers"),
])
def test_a_user_without_the_rule_is_one_line_at_start_on_redis_6_2(
        namespace, args, rule_without) -> None:
    """Redis 6.2 has no ACL DRYRUN, so no probe: the first refused call says it."""
    server = RedisServer(executable=redis_6_2_server()).start()
    try:
        with redis.Redis(port=server.port) as admin:
            url = make_user(admin, "old", f"{acl_rule(namespace)} -{rule_without}")
        line = one_clear_line(run_obsq(*args, "--redis-url", url, "--namespace", namespace),
                              "refused to the Redis user", rule_without,
                              f"obsq acl --namespace {namespace}")
        assert ":pw@" not in line
    finally:
        server.close()


async def test_a_user_denied_info_warns_once_and_runs(admin, namespace, start_worker,
                                                      caplog) -> None:
    """INFO only tells the memory policy, the version (HELLO does too) and the memory
    share: a user without it runs, with one warning of the policy it cannot read."""
    caplog.set_level(logging.WARNING, "obsq")
    url = make_user(admin, "no-info", f"{acl_rule(namespace)} -info")
    app = obsq.App(namespace=namespace)
    app.task("ok")(lambda task: task.payload)
    await start_worker(app, redis_url=url)
    admin_url = url.replace("no-info:pw@", "")
    async with obsq.Client(admin_url, app=app) as client:
        assert await client.result(await client.enqueue("ok", 7, retention=60), timeout=10) == 7
    # INFO refused to the worker's start-up check and to its heartbeat's first read of the
    # policy: warned of once still
    await wait_until(lambda: refusals(admin, "no-info", "info") >= 2)
    assert [m for m in caplog.messages if "maxmemory-policy" in m] == [
        f"cannot read Redis's maxmemory-policy at {url.replace('no-info:pw', '***')} "
        "(CONFIG GET and INFO denied); make sure it is noeviction, or tasks may be evicted"]
    assert run_obsq("stats", "--redis-url", url, "--namespace", namespace).returncode == 0


async def test_a_permission_taken_at_run_time_is_told_once(admin, namespace, start_worker,
                                                          caplog) -> None:
    """A refused BLPOP is no outage: one error naming `obsq acl`, no "reachable again"
    after each fetch that works between two waits that do not."""
    caplog.set_level(logging.INFO, "obsq")
    url = make_user(admin, "revoked", acl_rule(namespace))
    app = obsq.App(namespace=namespace)
    app.task("ok")(lambda task: task.payload)
    await start_worker(app, redis_url=url)
    admin.execute_command("ACL", "SETUSER", "revoked", "-blpop")
    # each of the worker's two blocking reads (fetch, cancels) refused twice, 2 s apart
    await wait_until(lambda: refusals(admin, "revoked", "blpop") >= 4, timeout=30)
    refused = [r.getMessage() for r in caplog.records if "refused to the Redis user" in
               r.getMessage()]
    assert refused and all(f"obsq acl --namespace {namespace}" in m for m in refused)
    assert len(refused) == len(set(refused)), refused  # each once
    assert not [m for m in caplog.messages if "reachable again" in m or "; retrying" in m]
    admin.execute_command("ACL", "SETUSER", "revoked", "+blpop")
    async with obsq.Client(url, app=app) as client:
        assert await client.result(await client.enqueue("ok", 1), timeout=10) == 1
