"""Options that cannot mean anything sensible are refused at once with one clear line,
whether given to the Python API, on the command line or in OBSQ_ variables: times that
never end (inf) or never compare (nan), a queue given twice, a namespace that would reach
outside its ACL grant, an eta that is not a datetime."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from support import obsq_env, one_clear_line, run_obsq

import obsq
from obsq.broker.acl import acl_rule
from obsq.settings import SchedulerSettings, WorkerSettings

URL = "redis://127.0.0.1:6379/0"  # never reached: everything here is refused before


@pytest.mark.parametrize("options, said", [
    ({"lease_seconds": math.inf}, "lease_seconds must be a non-negative number of seconds"),
    ({"lease_seconds": math.nan}, "lease_seconds must be a non-negative number of seconds"),
    ({"lease_seconds": -5}, "lease_seconds"),
    ({"lease_seconds": 0}, "lease_seconds"),
    ({"shutdown_timeout": math.inf}, "shutdown_timeout must be a non-negative number of seconds"),
    ({"shutdown_timeout": math.nan}, "shutdown_timeout"),
    ({"heartbeat_interval": math.inf}, "heartbeat_interval"),
    ({"heartbeat_ttl": math.nan}, "heartbeat_ttl"),
    ({"wait_timeout": -math.inf}, "wait_timeout"),
    # finite, but past what Redis's millisecond scores hold: a lease that expired at once
    ({"lease_seconds": 1e16}, "lease_seconds must be a non-negative number of seconds of "
                              "at most 315360000"),
    ({"shutdown_timeout": 1e300}, "shutdown_timeout"),
    ({"dedup_window": 1e300}, "dedup_window"),
    ({"stuck_limit": 1e300}, "stuck_limit"),
    ({"queues": "default=3,default=5"}, "queue 'default' is given twice"),
    ({"queues": "default, critical=2, default"}, "given twice"),
    ({"route_concurrency": "pdf:=2,pdf:=3"}, "task type 'pdf:' is given twice"),
    ({"namespace": "shop:tenant2"}, "letters, digits, '.', '_' or '-'"),
    ({"namespace": "shop*"}, "letters, digits"),
    ({"namespace": "a b"}, "letters, digits"),
    ({"namespace": "a{b}"}, "letters, digits"),
])
def test_the_worker_refuses(app, options, said) -> None:
    with pytest.raises(obsq.ConfigurationError, match=said.replace("*", r"\*")):
        obsq.Worker(app, **{"redis_url": URL, **options})


@pytest.mark.parametrize("variable, value, said", [
    ("OBSQ_LEASE_SECONDS", "inf", "lease_seconds must be a non-negative number of seconds"),
    ("OBSQ_HEARTBEAT_TTL", "nan", "heartbeat_ttl"),
    ("OBSQ_DEDUP_WINDOW", "1e300", "dedup_window"),
    ("OBSQ_UNKNOWN_TYPE_MAX_AGE", "1e300", "unknown_type_max_age"),
    ("OBSQ_QUEUES", "default=3,default=5", "given twice"),
    ("OBSQ_NAMESPACE", "shop:tenant2", "namespace 'shop:tenant2'"),
])
def test_the_worker_refuses_the_same_in_the_environment(variable, value, said) -> None:
    with pytest.raises(obsq.ConfigurationError, match=said):
        WorkerSettings.from_env({variable: value})


def test_the_scheduler_refuses_times_that_never_end() -> None:
    with pytest.raises(obsq.ConfigurationError, match="lock_ttl must be a non-negative number"):
        SchedulerSettings(lock_ttl=math.inf)
    with pytest.raises(obsq.ConfigurationError, match="missed_after"):
        SchedulerSettings.from_env({"OBSQ_MISSED_AFTER": "nan"})


@pytest.mark.parametrize("make", [
    lambda ns: obsq.App(namespace=ns),
    lambda ns: obsq.Client(URL, ns),
    lambda ns: obsq.Inspector(URL, ns),
    acl_rule,
])
def test_a_namespace_outside_its_acl_grant_is_refused_everywhere(make) -> None:
    with pytest.raises(obsq.ConfigurationError, match="namespace 'shop:tenant2'"):
        make("shop:tenant2")


def test_namespaces_as_people_write_them_are_accepted() -> None:
    for ns in ("obsq", "shop", "shop-eu.v2", "My_App"):
        assert obsq.App(namespace=ns).namespace == ns
    assert acl_rule("shop").startswith("resetkeys ~shop:* ")


@pytest.mark.parametrize("args, env, said", [
    (("--lease-seconds", "inf"), {}, "lease_seconds must be a non-negative number of seconds"),
    (("--lease-seconds", "nan"), {}, "lease_seconds must be a non-negative number of seconds"),
    (("--lease-seconds", "1e16"), {}, "lease_seconds must be"),
    (("--shutdown-timeout", "inf"), {}, "shutdown_timeout must be a non-negative number"),
    (("--queues", "default=3,default=5"), {}, "queue 'default' is given twice"),
    (("--namespace", "shop:tenant2"), {}, "namespace 'shop:tenant2'"),
    ((), {"OBSQ_LEASE_SECONDS": "inf"}, "lease_seconds must be a non-negative number of seconds"),
    ((), {"OBSQ_QUEUES": "default=3,default=5"}, "given twice"),
])
def test_the_worker_command_refuses_with_one_line_and_status_2(redis_url, args, env,
                                                                said) -> None:
    result = run_obsq("worker", "tests.engine.apps:app", "--redis-url", redis_url,
                      "--http-port", "0", "--no-metrics", "--no-tracing", *args,
                      env=obsq_env(**env))
    one_clear_line(result, said)
    assert result.returncode == 2


def test_the_acl_command_refuses_a_namespace_with_a_colon() -> None:
    result = run_obsq("acl", "--namespace", "shop:tenant2")
    one_clear_line(result, "namespace 'shop:tenant2'", "letters, digits")
    assert result.returncode == 2


@pytest.mark.parametrize("eta", ["2030-01-01T00:00:00", 30, 1.5, datetime.now().date()])
async def test_an_eta_that_is_not_a_datetime_is_refused_and_nothing_written(client, raw_redis,
                                                                            eta) -> None:
    with pytest.raises(TypeError, match="eta must be a datetime"):
        await client.enqueue("t", eta=eta)
    with pytest.raises(TypeError, match="eta must be a datetime"):
        await client.enqueue_many([obsq.Job("t", 1), obsq.Job("t", 2, eta=eta)])
    assert not list(raw_redis.scan_iter(match=f"{client.namespace}:*"))


async def test_an_eta_as_a_datetime_still_works(client) -> None:
    aware = datetime.now(timezone.utc) + timedelta(minutes=5)
    naive = datetime.now() + timedelta(minutes=5)
    for eta in (aware, naive):
        assert (await client.enqueue("t", eta=eta)).state == "scheduled"


@pytest.mark.parametrize("timeout", [math.inf, math.nan, "30", 1e300])
async def test_a_task_timeout_that_never_ends_is_refused(client, timeout) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        await client.enqueue("t", timeout=timeout)


@pytest.mark.parametrize("options, said", [
    ({"timeout": math.inf}, "timeout must be a positive number of seconds"),
    ({"timeout": math.nan}, "timeout must be a positive number of seconds"),
    ({"retry_delay": math.inf}, "retry_delay must be a non-negative number of seconds"),
    ({"retry_delay": -1}, "retry_delay"),
    ({"retry_delay": 1e300}, "retry_delay"),
])
def test_a_route_time_that_never_ends_is_refused(options, said) -> None:
    with pytest.raises(ValueError, match=said):
        obsq.App(namespace="shop").task("t", **options)
