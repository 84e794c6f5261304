"""Every default of obsq in one place: the named constants below, and WorkerSettings and
SchedulerSettings, the tunables of a worker and of a scheduler process, which read
`OBSQ_<NAME>` from the environment so that the CLI, the Helm chart and code agree. Times are
in seconds."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from typing import Any, ClassVar, TypeVar

from obsq.errors import ConfigurationError
from obsq.names import is_seconds, seconds_rule, validate_name, validate_namespace

# What a task gets when neither the producer nor its route says otherwise.
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_NAMESPACE = "obsq"
DEFAULT_QUEUE = "default"
DEFAULT_MAX_RETRY = 25
DEFAULT_TIMEOUT = 1800.0
ENQUEUE_BATCH = 500  # tasks per enqueue script call: bounds how long one call holds Redis
# Producers are refused once Redis's used memory passes this share of its maxmemory, so they
# cannot take the memory workers write to as they drain the queues (leases, results,
# retries); 1 turns the check off (Redis still refuses enqueues at maxmemory itself).
ENQUEUE_MEMORY_SHARE = 0.9
# INFO memory costs more Redis time than a small enqueue, so a reading's budget (half the
# room below the share) serves the enqueues of a queue at most this long (ms).
MEMORY_LOOK_MS = 100
# A task whose producer chose its id is remembered after obsq deletes it (its id only, in
# the queue's `ended` zset), and an enqueue of the same id is refused as a duplicate: for
# this long (WorkerSettings.dedup_window), or while it is among the last DEDUP_MAX_IDS of
# its queue, whichever is shorter (an id takes about 100 bytes of Redis memory).
DEDUP_WINDOW = 24 * 3600.0
DEDUP_MAX_IDS = 100_000
# Client(durable_replicas=N): how long an enqueue waits for N replicas to have its tasks
# before it is refused (the tasks are then on the master only).
DURABLE_WAIT_TIMEOUT = 2.0
# What one task may carry, encoded: a larger one is refused before anything is written (a
# 100 MB payload would hold Redis and a connection for seconds, and fill its memory). The
# payload's limit can be changed per App and per route; task ids and the other names are
# bounded by obsq.names.MAX_NAME_LENGTH.
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_HEADERS_BYTES = 64 * 1024
# Outcome counts for the Inspector: flushed by each worker this often (one script call a
# second; a SIGKILLed worker's last second of counts is what is lost), kept per minute for
# an hour and some slack for the minute being read.
THROUGHPUT_FLUSH_INTERVAL = 1.0
THROUGHPUT_BUCKET_TTL = 3900.0
# Default retry backoff: base * 2**retries, capped, then jittered to 50-100 %.
BACKOFF_BASE = 2.0
BACKOFF_CAP = 600.0
# The HTTP port of each process kind (metrics and probes), distinct so that several can
# share a host.
WORKER_HTTP_PORT = 9191
SCHEDULER_HTTP_PORT = 9192
EXPORTER_HTTP_PORT = 9193
OUTBOX_HTTP_PORT = 9194
# Connections per process: calls beyond the pool wait up to REDIS_POOL_TIMEOUT for one.
REDIS_MAX_CONNECTIONS = 50
REDIS_POOL_TIMEOUT = 20.0
CONNECT_TIMEOUT = 5.0
# The deadline of each call a Client or SyncClient makes (enqueue, publish, info, cancel...;
# not the wait of result(timeout=)): a Redis that does not answer within it (stopped, or
# behind a stuck proxy) fails the call with BrokerTimeout instead of holding a web app's
# request. Client(call_timeout=...) or OBSQ_CALL_TIMEOUT changes it; a worker's calls have
# it too (WorkerSettings.call_timeout), a blocking wait its own length on top.
CALL_TIMEOUT = 5.0
# TLS to Redis (rediss://): the CA that signed the server's certificate, and this client's
# certificate and key where Redis asks for one (tls-auth-clients), as files. The URL's query
# parameters of the same meaning win (rediss://host:6380/0?ssl_ca_certs=/tls/ca.crt).
REDIS_TLS_VARIABLES = {"ssl_ca_certs": "OBSQ_REDIS_TLS_CA", "ssl_certfile": "OBSQ_REDIS_TLS_CERT",
                       "ssl_keyfile": "OBSQ_REDIS_TLS_KEY"}
# Credentials beside a URL without them, as Redis charts and operators keep them (a Secret
# with only the password); a URL's own credentials win.
REDIS_CREDENTIAL_VARIABLES = {"username": "OBSQ_REDIS_USERNAME",
                              "password": "OBSQ_REDIS_PASSWORD"}
# Pause between attempts to reach a Redis that is away, doubling up to the cap.
REDIS_RETRY_MIN = 0.05
REDIS_RETRY_MAX = 2.0
# Inside the scripts (written into their source when they are loaded): wake tokens kept
# per queue, values per Redis command (Lua's unpack() fails near 8,000), how long a
# client's inbox of results outlives its last write.
WAKE_CAP = 64
LUA_SLICE = 1000
INBOX_TTL = 300
# Attempts per call of ack, extend and hand_back, and results per inbox read.
ATTEMPTS_PER_CALL = 1000
INBOX_BATCH = 1000
# The fairness keys with most waiting tasks that the queue figures name (metrics, tools):
# bounded, whatever the number of keys.
TOP_FAIRNESS_KEYS = 10
# Fetching: batch caps, and when a worker holds a second batch.
MAX_FETCH = 100
PREFETCH_BELOW_SECONDS = 0.05  # prefetch a second batch only while tasks take less
ACK_LINGER = 0.002  # how long completions may wait to ride along with the next fetch
STOP_WAIT = 2.0  # how long a stopping worker waits for Redis to end its blocking wait
FETCH_STOP_TIMEOUT = 15.0  # how long a drain waits for the fetch loop to end by itself
SWEEP_BATCH = 1000  # tasks per call of a maintenance sweep
# Waiting for results: how long one read of the inboxes blocks, and how often a waiter
# looks at its task again in case a notice was lost.
RESULT_READ_TIMEOUT = 2.0
RESULT_RECHECK = 10.0
# The queue gauges of /metrics: read from Redis at most once per cache period, within the
# timeout; after a failure, the last values are served for STALE_LIMIT.
COLLECTOR_CACHE = 1.0
COLLECTOR_TIMEOUT = 2.0
COLLECTOR_STALE_LIMIT = 30.0
# Producers' metrics: distinct `queue` label values beyond the App's routes' queues (queue
# names made per tenant would otherwise grow the series without end); OBSQ_METRICS_QUEUES.
METRICS_QUEUE_LIMIT = 100
# Health: an event loop that cannot run a callback within LOOP_TIMEOUT is stuck; the
# exporter and supervisor ping Redis every PING_INTERVAL.
LOOP_TIMEOUT = 1.5
PING_INTERVAL = 2.0
# Schedules: names short enough to make task ids of ("<name>@<fire time>"), the shortest
# interval, entries a scheduler reads per round, fires of one entry due at once (a scheduler
# that woke late, obsq.testing's clock) claimed and enqueued together, fires it counts one by
# one after an outage (past that it jumps to the last one), and entries a listing shows.
SCHEDULE_NAME_MAX = 100
SCHEDULE_MIN_EVERY = 0.1
SCHEDULE_DUE_BATCH = 100
SCHEDULE_FIRE_BATCH = ENQUEUE_BATCH
SCHEDULE_COUNT_LIMIT = 10_000
SCHEDULES_SHOWN = 1000
BYTES_SHOWN = 48  # of a bytes payload, shown in base64 by the tools and the console
SCHEDULER_WAIT_SLACK = 0.1  # Redis ends a blocking wait up to 1/hz (100 ms at hz 10) late
# Task groups: what app.aggregate gives a group unless told, batches one claim takes at
# most, how long an aggregated task (whose id is its batch's) is kept at least after it
# ends, so that a batch claimed again after a crash is refused as a duplicate, and the
# backoff of a batch whose aggregator failed (doubling from the base, capped).
AGGREGATE_MAX_SIZE = 100
AGGREGATE_MAX_DELAY = 30.0
AGGREGATE_GRACE_PERIOD = 5.0
AGGREGATE_BATCHES = 50
AGGREGATE_KEEP = 300.0
AGGREGATE_BACKOFF_BASE = 1.0
AGGREGATE_BACKOFF_CAP = 60.0
# Events: how long the copies of an event published with an event_id are kept at least
# after they end, so that the same publish sent again within it delivers nothing twice.
EVENT_KEEP = 300.0
# `obsq worker --processes N`: restarts of a child that died, doubling up to the cap; a
# child that ran STABLE_AFTER starts its backoff afresh; children get STOP_MARGIN beyond
# their shutdown timeout before they are killed.
RESTART_MIN = 1.0
RESTART_MAX = 30.0
STABLE_AFTER = 60.0
STOP_MARGIN = 10.0
# Redis must not evict: with any maxmemory-policy but noeviction it deletes task data under
# memory pressure. Workers and clients refuse such a Redis at start unless allowed; a worker
# looks again this often (WorkerSettings.policy_check_interval) and warns of a change.
SAFE_MEMORY_POLICY = "noeviction"
POLICY_CHECK_INTERVAL = 30.0
POOLS = ("thread", "process")  # where plain handlers run (obsq/engine/pools)
LOOPS = ("auto", "uvloop", "asyncio")  # the event loop a worker runs on (obsq/engine/eventloop.py)
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_flag(name: str, raw: str) -> bool:
    """A yes/no setting as written in the environment: 1/true/yes/on or 0/false/no/off, in
    any case; anything else is a ConfigurationError naming the setting."""
    word = raw.strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise ConfigurationError(f"{name}={raw!r} is not a yes/no value "
                                 f"({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)})")
    return word in TRUE_WORDS


def env_flag(variable: str, default: bool = False,
             environ: dict[str, str] | None = None) -> bool:
    """The yes/no environment variable `variable` (e.g. OBSQ_ALLOW_EVICTION); unset or
    empty: `default`."""
    raw = (os.environ if environ is None else environ).get(variable, "")
    return parse_flag(variable, raw) if raw.strip() else default


def redis_retry_delay(failures: int) -> float:
    """The pause after `failures` failed attempts in a row to reach Redis."""
    return min(REDIS_RETRY_MIN * 2 ** failures, REDIS_RETRY_MAX)


def parse_queues(value: str | dict[str, int]) -> dict[str, int]:
    """'critical=6,default=3' (or 'default') -> {'critical': 6, 'default': 3}."""
    if isinstance(value, str):
        for part in value.split(","):
            typo = _WEIGHT_TYPO.match(part.partition("=")[0].strip())
            if typo:
                raise ConfigurationError(f"{part.strip()!r}: a queue's weight follows '=', "
                                         f"as in {typo[1]}={typo[2]}")
    queues = _counts(value, "queue", "weight", default=1)
    if not queues:
        raise ConfigurationError("at least one queue is needed")
    return queues


def parse_route_limits(value: str | dict[str, int]) -> dict[str, int]:
    """'pdf:render=2,pdf:=5,*=20' -> {'pdf:render': 2, 'pdf:': 5, '*': 20}."""
    return _counts(value, "task type", "limit", default=None)


def _counts(value: str | dict[str, int], kind: str, what: str, default: int | None
            ) -> dict[str, int]:
    """'name=3,other' -> {name: 3, other: default}: names checked, counts positive."""
    items: list[tuple[str, int | None]]
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, equals, number = part.rpartition("=") if "=" in part else (part, "", "")
            if not number and default is None:
                raise ConfigurationError(f"{part!r} needs a {what}, as in {part}=2")
            try:
                items.append((name.strip(), int(number) if equals else default))
            except ValueError:
                raise ConfigurationError(f"{kind} {what} in {part!r} is not an integer"
                                         ) from None
    counts: dict[str, int] = {}
    for name, count in items:
        _checked_name(kind, name)
        if name in counts:
            raise ConfigurationError(f"{kind} {name!r} is given twice in {value!r}: give each "
                                     f"{kind} once, with its {what}")
        if not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"{kind} {name!r} needs a positive integer {what}, "
                                     f"got {count!r}")
        counts[name] = count
    return counts


_WEIGHT_TYPO = re.compile(r"^(.+?)[:\s]+(\d+)$")  # 'critical:6' or 'critical 6'


def _checked_name(kind: str, value: str) -> str:
    """A bad queue name or namespace is a configuration error (reported without a traceback
    by the CLI), not a plain ValueError."""
    try:
        return validate_name(kind, value)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


S = TypeVar("S", bound="EnvSettings")


class EnvSettings:
    """A settings dataclass that can be read from `OBSQ_<FIELD>` variables."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # each subclass is a dataclass

    def check_times(self) -> None:
        """Every time (a float field) is one obsq can keep (obsq/names.py): `inf`, `nan`
        or 1e16 would make a lease, a timeout or an interval one that never ends, never
        compares, or ends at once."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float) and not is_seconds(value, zero=True):
                raise ConfigurationError(f"{f.name} must be {seconds_rule(zero=True)}, "
                                         f"got {value!r}")

    @classmethod
    def from_env(cls: type[S], environ: Mapping[str, str] | None = None, **overrides: Any) -> S:
        """Settings from `OBSQ_<NAME>` variables; explicit overrides (not None) win."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f"OBSQ_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f.name, raw, f.default)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class WorkerSettings(EnvSettings):
    redis_url: str = DEFAULT_REDIS_URL
    namespace: str | None = None  # None: the App's namespace
    queues: dict[str, int] | None = None  # None: every queue the App's routes declare
    route_concurrency: dict[str, int] | None = None  # this worker's limit per route pattern
    concurrency: int = 50
    strict_priority: bool = False
    shutdown_timeout: float = 25.0
    lease_seconds: float = 30.0
    priority_aging: float = 60.0  # s pending that rank a task one priority higher (obsq/task.py)
    max_recoveries: int = 5
    http_port: int | None = None  # None or -1: no HTTP endpoint; 0: a free port
    http_host: str = "0.0.0.0"
    metrics: bool = True
    # The queue-wide gauges (obsq_queue_*, obsq_workers, ...) on its /metrics, read from
    # Redis at each scrape; off where one `obsq exporter` publishes them (the Helm chart).
    queue_metrics: bool = True
    tracing: bool = True
    processes: int = 1
    log_format: str = "text"
    log_level: str = "INFO"
    # The worker's loops: a heartbeat every interval, and a worker is lost after `ttl` of
    # silence (its tasks are then taken back); the sweeps, each in one process at a time
    # under a lock of `lock_ttl`; an idle worker's blocking wait; settling at shutdown.
    heartbeat_interval: float = 2.0
    heartbeat_ttl: float = 10.0
    forward_interval: float = 0.05  # the forwarder's longest sleep; it wakes sooner when due
    recover_interval: float = 1.0
    janitor_interval: float = 10.0
    lock_ttl: float = 5.0
    wait_timeout: float = 2.0
    settle_timeout: float = 5.0  # how long a stopping worker keeps trying to record outcomes
    # Every Redis call of the worker ends within this (a blocking wait: its wait on top), or
    # fails with BrokerTimeout on a connection then closed, and is tried again on a fresh
    # one: a connection a NAT or load balancer dropped silently gets no answer, ever.
    call_timeout: float = CALL_TIMEOUT
    # Task groups: the aggregator loop's longest sleep (it wakes sooner when a group is
    # due), and how long a claimed batch is its worker's before another may take it.
    aggregate_interval: float = 1.0
    aggregate_lease: float = 30.0
    # Events: a worker's subscriptions are renewed with each heartbeat and lapse this long
    # after the last renewal (its subscribers then get no more copies).
    subscription_ttl: float = 60.0
    # What is left behind: dead tasks (by age and count), and a task's progress.
    dead_max_age: float = 30 * 24 * 3600.0
    dead_max_count: int = 100_000
    dedup_window: float = DEDUP_WINDOW  # producer-chosen ids refused this long after deletion
    dedup_max_ids: int = DEDUP_MAX_IDS  # ... or while among the last this many of their queue
    progress_ttl: float = 24 * 3600.0
    unknown_type_max_age: float = 24 * 3600.0  # before a type no worker has goes dead
    # A Redis whose maxmemory-policy evicts is refused at start unless this is set (tasks
    # may then vanish under memory pressure); the heartbeat reads the policy again this often.
    allow_eviction: bool = False
    policy_check_interval: float = POLICY_CHECK_INTERVAL
    # Plain handlers run in threads, or in child processes that can be killed ("process").
    # A handler thread past its timeout holds its slot, stuck, until it returns (a thread
    # cannot be stopped); liveness fails once one is stuck this long (the pod restarts).
    pool: str = "thread"
    stuck_limit: float = 300.0
    # A process that runs handlers is replaced once it has ended this many tasks, or its
    # resident memory after a task passes this many MB (0: no limit): the process pool's
    # children, else the worker processes of `processes` > 1 (obsq/engine/recycling.py).
    max_tasks_per_child: int = 0
    max_memory_per_child: int = 0
    blocked_loop_warning: float = 2.0  # a handler blocking the event loop is logged past it
    blocked_loop_limit: float = 60.0  # and liveness fails past this (the pod is restarted)
    loop: str = "auto"  # uvloop where installed, else asyncio's (obsq/engine/eventloop.py)

    def __post_init__(self) -> None:
        self.check_times()
        if self.queues is not None:
            self.queues = parse_queues(self.queues)
        if self.route_concurrency is not None:
            self.route_concurrency = parse_route_limits(self.route_concurrency)
        if self.namespace is not None:
            validate_namespace(self.namespace)
        for name in ("concurrency", "processes", "dedup_max_ids"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be a positive integer, "
                                         f"got {getattr(self, name)!r}")
        if not self.lease_seconds >= 1:
            raise ConfigurationError(f"lease_seconds must be at least 1, got {self.lease_seconds}")
        if self.shutdown_timeout < 0:
            raise ConfigurationError(f"shutdown_timeout must not be negative, got "
                                     f"{self.shutdown_timeout}")
        if self.max_recoveries < 0:
            raise ConfigurationError("max_recoveries must not be negative")
        if not isinstance(self.max_tasks_per_child, int) or self.max_tasks_per_child < 0:
            raise ConfigurationError(f"max_tasks_per_child must be a whole number, 0 for no "
                                     f"limit, got {self.max_tasks_per_child!r}")
        if not isinstance(self.max_memory_per_child, int) or self.max_memory_per_child < 0:
            raise ConfigurationError(f"max_memory_per_child must be whole MB, 0 for no limit, "
                                     f"got {self.max_memory_per_child!r}")
        for name in ("heartbeat_interval", "forward_interval", "recover_interval", "lock_ttl",
                     "janitor_interval", "wait_timeout", "call_timeout", "dead_max_age",
                     "progress_ttl", "policy_check_interval", "aggregate_interval",
                     "dedup_window", "stuck_limit",
                     "aggregate_lease", "unknown_type_max_age", "blocked_loop_warning",
                     "blocked_loop_limit", "priority_aging"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.heartbeat_ttl > self.heartbeat_interval:
            raise ConfigurationError("heartbeat_ttl must be longer than heartbeat_interval")
        if not self.subscription_ttl > self.heartbeat_interval:
            raise ConfigurationError("subscription_ttl must be longer than heartbeat_interval")
        if self.http_port is not None and not -1 <= self.http_port <= 65535:  # -1: off
            raise ConfigurationError(f"http_port {self.http_port} is not a TCP port")
        for name, allowed in (("log_format", ("text", "json")), ("pool", POOLS),
                              ("loop", LOOPS)):
            if getattr(self, name) not in allowed:
                raise ConfigurationError(f"{name} must be {' or '.join(allowed)}, "
                                         f"got {getattr(self, name)!r}")


@dataclass
class SchedulerSettings(EnvSettings):
    # One replica at a time fires, under a lock of `lock_ttl`: when it dies another takes
    # over within 1.5 times that. A fire reached later than `missed_after` after its time
    # (the schedulers were all down) is missed and follows its entry's `missed` policy;
    # later than a takeover is not, so a failover loses nothing.
    lock_ttl: float = 5.0
    missed_after: float = 15.0
    allow_eviction: bool = False  # as a worker's: accept a Redis that may evict task data
    # As a worker's: each Redis call ends within this (its wait for a change: the wait on
    # top), so a connection the network dropped silently costs a retry, not every fire.
    call_timeout: float = CALL_TIMEOUT

    def __post_init__(self) -> None:
        self.check_times()
        for name in ("lock_ttl", "call_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.missed_after >= 1.5 * self.lock_ttl:
            raise ConfigurationError(
                f"missed_after ({self.missed_after}) must be at least 1.5 times lock_ttl "
                f"({self.lock_ttl}), or the fires of a failover would count as missed")


def _convert(name: str, raw: str, default: Any) -> Any:
    if name == "queues":
        return raw
    if name == "http_port":
        default = 0
    try:
        if isinstance(default, bool):
            return parse_flag(f"OBSQ_{name.upper()}", raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise ConfigurationError(f"OBSQ_{name.upper()}={raw!r} is not a valid "
                                 f"{type(default).__name__}") from None
    return raw
