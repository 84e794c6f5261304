"""The parts that need no Redis, tested fast: building a message from a job, reading
`--queues`, settings, names, the pattern table of routes and pages read across a queue's
partitions (schedule entries: test_schedule.py)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import pytest

import obsq
from obsq.app import PatternTable
from obsq.broker import Broker
from obsq.errors import ConfigurationError
from obsq.inspection.partition_view import across, partitions_of, readable
from obsq.names import validate_name
from obsq.settings import DEFAULT_QUEUE, WorkerSettings, parse_queues
from obsq.task import build_message


def test_a_job_becomes_a_checked_message() -> None:
    m = build_message(obsq.Job("email:send", {"to": "a"}, unique_for=60, retention=1.5,
                               headers={"h": "v"}), queue="critical", max_retry=3)
    assert (m.type, m.queue, m.max_retry, m.retention, m.delay) == (
        "email:send", "critical", 3, 1.5, 0.0)
    assert m.payload == b'{"to":"a"}' and len(m.id) == 32
    assert m.unique_key and m.unique_for == 60
    same = build_message(obsq.Job("email:send", {"to": "a"}, unique_for=5))
    assert same.unique_key == m.unique_key  # type and payload decide, not the options
    assert build_message(obsq.Job("t")).queue == DEFAULT_QUEUE
    # the job's own option wins over the route's
    assert build_message(obsq.Job("t", queue="mine"), queue="route's").queue == "mine"


def test_an_eta_becomes_a_delay_on_the_producers_clock() -> None:
    now = 1_000_000.0
    eta = datetime.fromtimestamp(now + 30, tz=timezone.utc)
    assert build_message(obsq.Job("t", eta=eta), now=now).delay == pytest.approx(30)
    assert build_message(obsq.Job("t", eta=eta - timedelta(hours=1)), now=now).delay == 0
    assert build_message(obsq.Job("t", delay=2.5)).delay == 2.5


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "America/Los_Angeles", "UTC"])
def test_a_naive_eta_is_local_time(monkeypatch, zone: str) -> None:
    """`datetime.now() + timedelta(minutes=5)` means in five minutes wherever it runs."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        eta = datetime.now() + timedelta(minutes=5)
        assert build_message(obsq.Job("t", eta=eta)).delay == pytest.approx(300, abs=2)
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("job, error", [
    (obsq.Job("t", delay=-1), "delay"),
    (obsq.Job("t", delay=1, eta=datetime.now(timezone.utc)), "delay or eta"),
    (obsq.Job("t", unique_for=0.0001), "unique_for"),
    (obsq.Job("t", retention=math.inf), "retention"),
    (obsq.Job("t", max_retry=-1), "max_retry"),
    (obsq.Job("t", timeout=0), "timeout"),
    (obsq.Job("t", {"x": math.nan}), "NaN"),
    (obsq.Job("t", task_id="a{b}"), "braces"),
    (obsq.Job("t", queue="has space"), "spaces"),
])
def test_bad_options_are_refused(job: obsq.Job, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build_message(job)


def test_a_payload_that_is_not_json_is_refused() -> None:
    with pytest.raises(TypeError, match="not JSON-serializable"):
        build_message(obsq.Job("t", {1, 2}))


@pytest.mark.parametrize("text, queues", [
    ("default", {"default": 1}),
    ("critical=6, default=3", {"critical": 6, "default": 3}),
    ("file:à:traiter=2", {"file:à:traiter": 2}),
])
def test_queues_are_read_from_text(text: str, queues: dict[str, int]) -> None:
    assert parse_queues(text) == queues


@pytest.mark.parametrize("text, error", [
    ("critical:6", "critical=6"), ("a=zero", "not an integer"), ("a=0", "positive"),
    ("", "at least one"), ("{x}=1", "braces"),
])
def test_bad_queues_are_one_configuration_error(text: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        parse_queues(text)


def test_settings_come_from_the_environment_and_are_checked() -> None:
    s = WorkerSettings.from_env({"OBSQ_CONCURRENCY": "7", "OBSQ_HEARTBEAT_TTL": "4.5"},
                                lease_seconds=12)
    assert (s.concurrency, s.heartbeat_ttl, s.lease_seconds, s.queues) == (7, 4.5, 12, None)
    with pytest.raises(ConfigurationError, match="OBSQ_CONCURRENCY"):
        WorkerSettings.from_env({"OBSQ_CONCURRENCY": "many"})
    with pytest.raises(ConfigurationError, match="heartbeat_ttl"):
        WorkerSettings(heartbeat_interval=5, heartbeat_ttl=5)


async def test_a_brokers_settings_are_given_where_it_is_made() -> None:
    """Checked there, and never written into it afterwards: a Client given a broker does
    not take settings of its own that only that broker could hold. No Redis is reached."""
    url = "redis://127.0.0.1:1/0"
    broker = Broker(url, "ns", memory_share=0.5, priority_aging=2.0, dedup_window=5.0)
    assert (broker.memory_share, broker.priority_aging, broker.dedup_window) == (0.5, 2.0, 5.0)
    for bad in ({"memory_share": 0}, {"memory_share": 1.5}, {"durable_replicas": -1}):
        with pytest.raises(ConfigurationError):
            Broker(url, "ns", **bad)
    client = obsq.Client(url, "ns", durable_replicas=2)
    assert client.broker.durable_replicas == 2
    await client.close()
    for given in ({"durable_replicas": 1}, {"memory_share": 0.5}):
        with pytest.raises(ConfigurationError, match="give them to the Broker"):
            obsq.Client(url, "ns", broker=broker, **given)
    await broker.close()



def test_durable_replicas_on_a_cluster_is_refused_saying_why_and_what_instead() -> None:
    """No Redis is reached: a Cluster client connects at its first call."""
    with pytest.raises(ConfigurationError) as refused:
        obsq.Client("redis+cluster://127.0.0.1:1", "ns", durable_replicas=1)
    for words in ("not available on a Redis Cluster", "WAIT behind each enqueue",
                  "min-replicas-to-write", "Sentinel"):
        assert words in str(refused.value)

def test_names() -> None:
    assert validate_name("task type", "report:") == "report:"
    for bad in ("", "x" * 201, "a\nb", "{a}"):
        with pytest.raises(ValueError):
            validate_name("queue", bad)


def test_the_pattern_table_finds_the_exact_type_then_the_longest_prefix_then_star() -> None:
    table: PatternTable[str] = PatternTable()
    assert table.match("mail:send") is None
    for pattern in ("*", "mail:", "mail:bulk.", "mail:send"):
        table.add(pattern, pattern)
    assert table.match("mail:send") == "mail:send"
    assert table.match("mail:bulk.daily") == "mail:bulk."  # the longest prefix
    assert table.match("mail:receive") == "mail:"
    assert table.match("mailer") == "*"  # a prefix ends at ':' or '.', not mid-word
    assert "mail:" in table and "mail" not in table
    assert sorted(table.values()) == ["*", "mail:", "mail:bulk.", "mail:send"]


def test_the_pattern_table_forgets_what_it_found_when_a_pattern_is_added() -> None:
    table: PatternTable[str] = PatternTable()
    table.add("mail:", "prefix")
    assert table.match("mail:send") == "prefix"  # now cached
    assert table.match("other") is None  # a miss is cached too
    table.add("mail:send", "exact")
    table.add("*", "any")
    assert table.match("mail:send") == "exact" and table.match("other") == "any"


def test_the_pattern_tables_cache_stays_bounded_under_unbounded_types() -> None:
    table: PatternTable[int] = PatternTable()
    table.add("*", 1)
    assert all(table.match(f"type-{i}") == 1 for i in range(10_050))
    assert len(table._cache) == 10_000


async def test_a_page_across_partitions_takes_each_window_once() -> None:
    rows = [[f"{p}-{i}" for i in range(n)] for p, n in enumerate([3, 0, 5, 2])]
    everything = [r for part in rows for r in part]

    async def read(p: int, start: int, n: int, cap: int) -> tuple[list[str], int | None]:
        window = rows[p][start:start + min(n, cap)]
        end = start + len(window)
        return window, end if end < len(rows[p]) else None

    for limit in (1, 2, 3, 4, 10):
        seen, offset = [], 0
        while offset is not None:
            page, offset = await across([3, 0, 5, 2], offset, limit, read, 10_000)
            assert len(page) <= limit
            seen += page
        assert seen == everything, limit
    assert await across([3, 0, 5, 2], 10, 4, read, 10_000) == ([], None)
    assert await across([3, 0, 5, 2], 4, 20, read, 10_000) == (everything[4:], None)
    # a scan budget spent in one partition ends the page at the next one
    assert await across([3, 0, 5, 2], 0, 20, read, 3) == (everything[:3], 3)


def test_partitions_are_gathered_under_their_queue() -> None:
    names = ["events#1/3.23", "mail", "events#0/2.1", "events", "events#0/3.0"]
    assert partitions_of(names) == {
        "events": ["events", "events#0/2.1", "events#0/3.0", "events#1/3.23"],
        "mail": ["mail"]}
    assert readable("events#1/3.23") == "events (partition 1/3: events#1/3.23)"
    assert readable("mail") == "mail"
