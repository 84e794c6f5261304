"""Turning a URL into a redis-py client: plain, TLS, unix socket, Cluster or Sentinel.

Automatic retries of redis-py are off: a Lua call that reached Redis before the
connection broke must not run twice. Callers retry at their own level.

A dead server or network is detected by TCP keepalive and TCP_USER_TIMEOUT within about
ten seconds, not by a socket timeout: redis-py wraps every send in `asyncio.wait_for`
when a socket timeout is set, which costs a task per command (a third of a round trip).
Neither sees a connection that a NAT, conntrack or load balancer dropped silently while a
proxy's kernel still acknowledges every byte: no reply ever comes. The calls' own deadlines
do (calls.py: one timer per length of deadline on the event loop; `call_timeout` below, a
socket timeout, on a blocking client).

Connections come from a blocking pool: a burst of concurrent calls (2,000 enqueues of a
busy web app, 1,000 handlers publishing progress) waits for a free connection instead of
failing with "Too many connections", so a process never holds more than
REDIS_MAX_CONNECTIONS (`?max_connections=N` in the URL changes it). A Cluster keeps a pool
per node (redis-py has no blocking variant of it).

TLS (rediss://, rediss+cluster://) takes its CA, client certificate and key from the URL's
query (ssl_ca_certs, ssl_certfile, ssl_keyfile) or from OBSQ_REDIS_TLS_CA, _CERT and _KEY,
so that every process (worker, client, scheduler, exporter, console) reads them alike; a
file that is not there is a ConfigurationError before any connection.

Credentials come from the URL, or, when it has none, from OBSQ_REDIS_USERNAME and
OBSQ_REDIS_PASSWORD (a Secret with only the password, as Redis charts keep it): the URL's
own win, so a URL that names its user and password means exactly what it says."""

from __future__ import annotations

import encodings.idna  # noqa: F401  (see below)
import inspect
import os
import socket
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.sentinel import SentinelConnectionPool as SyncSentinelPool

from obsq.broker.diagnosis import safe
from obsq.errors import ConfigurationError

# socket.getaddrinfo encodes every host name with the idna codec, which Python imports on
# first use: imported above, on the thread that imports obsq, not on the first thread to
# connect (a worker's heartbeat), where glibc would keep its memory in an arena of that
# thread's own (0.3 MB of a worker's resident memory).
from obsq.settings import (
    CONNECT_TIMEOUT,
    REDIS_CREDENTIAL_VARIABLES,
    REDIS_MAX_CONNECTIONS,
    REDIS_POOL_TIMEOUT,
    REDIS_TLS_VARIABLES,
)

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel")
# Linux names; elsewhere plain keepalive with the system's timers.
KEEPALIVE = {getattr(socket, name): value for name, value in (
    ("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 10_000),
) if hasattr(socket, name)}


def create_client(url: str, *, blocking: bool = False, call_timeout: float | None = None
                  ) -> Any:
    """A redis-py asyncio client for `url` (or, with `blocking`, a synchronous one, thread
    safe, for the SyncClient's enqueues); raises ConfigurationError on a malformed URL.
    `call_timeout`: every socket read and write, connect and wait for a free connection
    ends within it (the blocking client's deadline, which no timer can interrupt)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"Redis URL {url!r} is not a URL like redis://host:6379/0")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigurationError(
            f"Redis URL scheme {parts.scheme!r} is not one of {', '.join(SCHEMES)}")
    _check_database(url, parts)
    if parts.scheme != "redis+sentinel":  # its query is read by _sentinel_client
        _check_query(url, parts)
    options: dict[str, Any] = {
        "socket_timeout": None, "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_keepalive": True, "socket_keepalive_options": KEEPALIVE,
        "retry": (SyncRetry if blocking else Retry)(NoBackoff(), 0),
        "decode_responses": False, **_tls_files(parts), **_credentials(parts),
    }
    pool_timeout = REDIS_POOL_TIMEOUT
    if call_timeout is not None:
        options.update(socket_timeout=call_timeout,
                       socket_connect_timeout=min(CONNECT_TIMEOUT, call_timeout))
        pool_timeout = call_timeout
    try:
        if parts.scheme.endswith("+cluster"):
            plain, others = _cluster_seeds(parts)
            options.pop("retry")
            if others:  # tried in turn until one answers
                node = SyncClusterNode if blocking else ClusterNode
                options["startup_nodes"] = [node(host, port) for host, port in others]
            return (SyncRedisCluster if blocking else RedisCluster).from_url(plain, **options)
        options.update(max_connections=REDIS_MAX_CONNECTIONS, timeout=pool_timeout)
        if parts.scheme == "redis+sentinel":
            return _sentinel_client(parts, options, blocking)
        if blocking:
            return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **options))
        return aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(url, **options))
    except ValueError as exc:
        raise ConfigurationError(f"Redis URL {url!r} is invalid: {exc}") from None


def _check_query(url: str, parts: Any) -> None:
    """redis-py hands a query parameter it does not know to each connection it makes, where
    it fails every command with a TypeError: a typo (`?max_conections=10`) is said here, in
    one line, naming the parameter."""
    known = set(redis.connection.URL_QUERY_ARGUMENT_PARSERS)
    for kind in (redis.connection.AbstractConnection, redis.connection.Connection,
                 redis.connection.SSLConnection, redis.connection.UnixDomainSocketConnection,
                 *((RedisCluster,) if parts.scheme.endswith("+cluster") else ())):
        known.update(inspect.signature(kind.__init__).parameters)
    for name in parse_qs(parts.query, keep_blank_values=True):
        if name not in known or name in ("self", "kwargs"):
            import difflib  # only for the error: not loaded by every process at start

            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise ConfigurationError(
                f"Redis URL {safe(url)!r} has a query parameter redis-py does not know: "
                f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))


def _cluster_seeds(parts: Any) -> tuple[str, list[tuple[str, int]]]:
    """A Cluster URL may name several seed nodes (`redis+cluster://a:6379,b:6379,c:6379/0`),
    so a client starts while any of them is up: (the URL of the first, as redis-py reads
    it, and the others' host and port)."""
    credentials, _, hosts = parts.netloc.rpartition("@")
    first = hosts.split(",")[0]
    netloc = f"{credentials}@{first}" if credentials else first
    return (parts._replace(scheme=parts.scheme.split("+")[0], netloc=netloc).geturl(),
            _hosts(parts, 6379)[1:])


def _hosts(parts: Any, default_port: int) -> list[tuple[str, int]]:
    """The hosts a Cluster or Sentinel URL names, comma-separated: [(host, port)]."""
    seeds = [urlsplit(f"//{seed}") for seed in parts.netloc.rpartition("@")[2].split(",")]
    return [(seed.hostname or "", seed.port or default_port) for seed in seeds]


def _check_database(url: str, parts: Any) -> None:
    """redis-py reads a database path that is not a number (redis://host/abc) as db 0:
    another database than the one meant, silently."""
    database = parts.path.strip("/")
    if parts.scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster") and (
            database and not database.isdigit()):
        raise ConfigurationError(f"Redis URL {url!r}: the database {database!r} is not a "
                                 "number (redis://host:6379/0)")


def _tls_files(parts: Any) -> dict[str, str]:
    """The TLS files of the environment (the URL's own win, in redis-py), each checked."""
    query = parse_qs(parts.query)
    files = {name: os.environ[variable] for name, variable in REDIS_TLS_VARIABLES.items()
             if os.environ.get(variable)}
    if files and not parts.scheme.startswith("rediss"):
        raise ConfigurationError(f"{', '.join(REDIS_TLS_VARIABLES[n] for n in files)} "
                                 f"given, but the Redis URL's scheme is {parts.scheme}, "
                                 "not rediss")
    for name in REDIS_TLS_VARIABLES:
        path = query[name][0] if name in query else files.get(name)
        if path is not None and not os.path.isfile(path):
            raise ConfigurationError(f"the TLS file {path} ({name}) does not exist")
    return files


def _credentials(parts: Any) -> dict[str, str]:
    """OBSQ_REDIS_USERNAME and OBSQ_REDIS_PASSWORD, unless the URL has credentials of its
    own, which then win."""
    given = {name: os.environ[variable] for name, variable in REDIS_CREDENTIAL_VARIABLES.items()
             if os.environ.get(variable)}
    if "username" in given and "password" not in given:
        raise ConfigurationError("OBSQ_REDIS_USERNAME is set without OBSQ_REDIS_PASSWORD")
    return {} if parts.username or parts.password else given


def _sentinel_client(parts: Any, options: dict[str, Any], blocking: bool) -> Any:
    """redis+sentinel://[:password@]host:port[,host:port]/service_name[/db]"""
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ConfigurationError("a redis+sentinel URL needs the service name as its path")
    hosts = _hosts(parts, 26379)
    query = parse_qs(parts.query)
    if blocking:  # redis-py has no blocking pool for it: the plain one
        options.pop("timeout")
    if parts.password:  # else the environment's, in options
        options.update(username=parts.username or None, password=parts.password)
    options.update(sentinel_kwargs={"password": query.get("sentinel_password", [None])[0]},
                   db=int(path[1]) if len(path) > 1 else 0)
    if blocking:
        return SyncSentinel(hosts, **options).master_for(path[0])
    return Sentinel(hosts, **options).master_for(path[0],
                                                 connection_pool_class=_BlockingSentinelPool)


def kept_connection(client: Any) -> Any:
    """One connection made like those of `client`'s pool (asyncio or blocking), for a
    producer to keep beside the pool: no checkout per enqueue (a third of a loopback round
    trip), and the pool's connections stay free for the calls that follow an enqueue, such
    as a result wait. None on a Cluster or Sentinel: a connection kept there would stay
    with the old master after a failover or a slot move."""
    if not isinstance(client, (aioredis.Redis, redis.Redis)) or isinstance(
            client.connection_pool, (SentinelConnectionPool, SyncSentinelPool)):
        return None
    pool = client.connection_pool
    return pool.connection_class(**pool.connection_kwargs)


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The master's pool of a Sentinel setup, waiting for a free connection like the others."""
