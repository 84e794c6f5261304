"""The `obsq` command's exit status: 2 for a command line (or OBSQ_ variable) it cannot
take, 1 for what fails when it runs: Redis away, the App's module not importable, a port
taken. And `-V` for the version."""

from __future__ import annotations

import socket

import pytest
from support import obsq_env, one_clear_line, run_obsq

import obsq
from obsq._version import __version__
from obsq.redis_server import free_port


def test_v_prints_the_version() -> None:
    for flag in ("-V", "--version"):
        result = run_obsq(flag)
        assert (result.returncode, result.stdout.strip()) == (0, f"obsq {__version__}")


def test_an_unreachable_redis_is_a_runtime_failure() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["stats"], ["exporter", "--http-port", "0"]):  # a worker waits for it
        result = run_obsq(*args, "--redis-url", url)
        assert result.returncode == 1, (args, result.stderr)
        one_clear_line(result, "cannot reach Redis", "Connection refused")


def test_an_app_that_does_not_import_is_a_runtime_failure(redis_url) -> None:
    result = run_obsq("worker", "no_such_module_here:app", "--redis-url", redis_url,
                      "--http-port", "-1")
    assert result.returncode == 1
    one_clear_line(result, "cannot import 'no_such_module_here'")


def test_a_taken_port_is_a_runtime_failure(redis_url) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_obsq("ui", "--redis-url", redis_url, "--http-port", str(port))
    assert result.returncode == 1
    one_clear_line(result, f"cannot listen on 127.0.0.1:{port}")


def test_usage_errors_exit_2(redis_url) -> None:
    assert run_obsq("worker").returncode == 2  # argparse: MODULE:APP missing
    assert run_obsq("stats", "--no-such-flag").returncode == 2
    result = run_obsq("worker", "tests.engine.apps:app", "--redis-url", redis_url,
                      env=obsq_env(OBSQ_CONCURRENCY="many"))
    assert result.returncode == 2
    one_clear_line(result, "OBSQ_CONCURRENCY")
    result = run_obsq("worker", "not-a-spec", "--redis-url", redis_url)
    assert result.returncode == 2
    one_clear_line(result, "expected MODULE:APP")


def test_a_database_that_is_not_a_number_or_an_empty_namespace_is_a_usage_error(
        redis_url) -> None:
    """Neither falls back silently (to db 0, to the namespace `obsq`)."""
    bad_url = redis_url.rpartition("/")[0] + "/abc"
    for args in (["stats", "--redis-url", bad_url],
                 ["worker", "tests.engine.apps:app", "--redis-url", bad_url, "--http-port", "-1"]):
        result = run_obsq(*args)
        assert result.returncode == 2, (args, result.stderr)
        one_clear_line(result, "the database 'abc' is not a number")
    for args in (["stats"], ["worker", "tests.engine.apps:app", "--http-port", "-1"]):
        result = run_obsq(*args, "--namespace", "", "--redis-url", redis_url)
        assert result.returncode == 2 and "namespace '' must be" in result.stderr, result.stderr


def test_a_typo_in_a_redis_urls_query_is_one_line_naming_it(redis_url) -> None:
    """redis-py would hand the unknown parameter to every connection, and every command
    would fail with a TypeError traceback."""
    typo = redis_url + "?max_conections=10"
    for args in (["queues", "--redis-url", typo],
                 ["worker", "tests.engine.apps:app", "--redis-url", typo, "--http-port", "-1"]):
        result = run_obsq(*args)
        assert result.returncode == 2, (args, result.stderr)
        one_clear_line(result, "'max_conections'", "did you mean 'max_connections'?")
    known = redis_url + "?max_connections=10&socket_keepalive=true&health_check_interval=5"
    assert run_obsq("queues", "--redis-url", known).returncode == 0
    with pytest.raises(obsq.ConfigurationError, match="max_conections"):
        obsq.Client(typo)


def test_ui_port_is_http_port_and_the_old_flag_still_works(redis_url) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_obsq("ui", "--redis-url", redis_url, "--port", str(port))
    assert result.returncode == 1  # the old flag reached the same setting
    assert "--port is deprecated, use --http-port" in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--http-port" in run_obsq("ui", "--help").stdout


def test_a_page_the_inspector_cannot_read_is_a_usage_error(redis_url) -> None:
    for flag, value in (("--limit", "0"), ("--limit", "100000000"), ("--offset", "-5")):
        result = run_obsq("tasks", "default", "dead", flag, value, "--redis-url", redis_url)
        assert result.returncode == 2, (flag, value, result.stderr)
        assert f"argument {flag}: {value!r} is not a whole number" in result.stderr
