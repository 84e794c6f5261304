"""The `obsq` command. Every flag can also be set as `OBSQ_<FLAG>` in the environment
(e.g. OBSQ_REDIS_URL, OBSQ_CONCURRENCY), which is how the Helm chart configures pods."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from obsq._version import __version__
from obsq.app import load_app
from obsq.engine import eventloop
from obsq.errors import BrokerError, ConfigurationError, StartupError
from obsq.names import validate_namespace
from obsq.ops.admin import add_commands as add_admin_commands
from obsq.ops.supervisor import LIFELINE_FLAG
from obsq.settings import (
    DEFAULT_NAMESPACE,
    EXPORTER_HTTP_PORT,
    LOOPS,
    OUTBOX_HTTP_PORT,
    POOLS,
    SCHEDULER_HTTP_PORT,
    WORKER_HTTP_PORT,
    SchedulerSettings,
    WorkerSettings,
)

if TYPE_CHECKING:
    from obsq.outbox import Relay

log = logging.getLogger("obsq")
ALLOW_EVICTION = ("--allow-eviction",)
ALLOW_EVICTION_OPTIONS: dict[str, Any] = {
    "action": "store_const", "const": True,
    "help": "start even when Redis's maxmemory-policy may evict task data, which loses "
            "tasks under memory pressure (OBSQ_ALLOW_EVICTION)"}


def _redis_url(args: argparse.Namespace) -> str:
    return args.redis_url or os.environ.get("OBSQ_REDIS_URL") or WorkerSettings.redis_url


def _http_port(args: argparse.Namespace, default: int) -> int:
    if args.http_port is not None:
        return args.http_port
    raw = os.environ.get("OBSQ_HTTP_PORT") or default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"OBSQ_HTTP_PORT={raw!r} is not a port number") from None


def _namespace(args: argparse.Namespace) -> str:
    return args.namespace or os.environ.get("OBSQ_NAMESPACE") or DEFAULT_NAMESPACE


def cmd_worker(args: argparse.Namespace) -> int:
    from obsq.observability import (
        configure_logging,
        run_worker,
        setup_otel_metrics,
        setup_tracing,
        shutdown_otel_metrics,
        shutdown_tracing,
    )

    settings = WorkerSettings.from_env(
        redis_url=args.redis_url, namespace=args.namespace, queues=args.queues,
        route_concurrency=args.route_concurrency, concurrency=args.concurrency,
        processes=args.processes, http_port=args.http_port,
        lease_seconds=args.lease_seconds, shutdown_timeout=args.shutdown_timeout,
        strict_priority=args.strict_priority, max_recoveries=args.max_recoveries,
        log_format=args.log_format, log_level=args.log_level,
        allow_eviction=args.allow_eviction, pool=args.pool, stuck_limit=args.stuck_limit,
        loop=args.loop, max_tasks_per_child=args.max_tasks_per_child,
        max_memory_per_child=args.max_memory_per_child,
        metrics=False if args.no_metrics else None, tracing=False if args.no_tracing else None,
        queue_metrics=False if args.no_queue_metrics else None)
    eventloop.uses_uvloop(settings.loop)  # refused now, not after the app is loaded
    if settings.http_port is None:
        settings.http_port = WORKER_HTTP_PORT
    elif settings.http_port < 0:
        settings.http_port = None  # no endpoint: a supervisor's child, or by choice
    configure_logging(settings.log_format, settings.log_level)
    if (settings.max_tasks_per_child or settings.max_memory_per_child) and \
            settings.pool != "process" and settings.processes == 1 and args.supervisor_fd is None:
        log.warning("--max-tasks-per-child and --max-memory-per-child limit the children of "
                    "--pool process, or the worker processes of --processes N: a single "
                    "worker process with a thread pool is never replaced")
    if settings.processes > 1:
        from obsq.ops.supervisor import Supervisor

        return Supervisor(args.app, settings).run()
    if settings.http_port is not None:
        from obsq.observability.metrics import clear_multiprocess_dir

        clear_multiprocess_dir()  # this process serves the directory: drop a past run's files
    app = load_app(args.app)
    if settings.tracing:
        setup_tracing()
    if settings.metrics:
        setup_otel_metrics()
    from obsq.engine.worker import Worker

    supervised = args.supervisor_fd is not None  # a child of `--processes N`
    worker = Worker(app, settings=settings, handle_signals=not supervised)
    recycler = None
    relay = _outbox_relay(args.outbox_database_url, settings.redis_url, settings.processes)

    async def serve() -> None:
        nonlocal recycler
        if supervised:
            from obsq.ops.supervisor import serve_supervised

            recycler = serve_supervised(worker, args.supervisor_fd)
        running = run_worker(worker, http_port=settings.http_port,
                             http_host=settings.http_host, metrics=settings.metrics,
                             tracing=settings.tracing, queue_metrics=settings.queue_metrics)
        if relay is None:
            return await running
        from obsq.outbox.process import beside

        await beside(running, relay(worker.namespace))

    try:
        eventloop.run(serve(), settings.loop)
    finally:
        shutdown_tracing()
        shutdown_otel_metrics()
    if recycler is not None and recycler.reason is not None:
        from obsq.ops.supervisor import RECYCLED

        return RECYCLED  # drained past its limits: the supervisor starts another at once
    return 0


def _outbox_relay(database_url: str | None, redis_url: str, processes: int
                  ) -> Callable[[str], Relay] | None:
    """The outbox relay a worker runs beside itself (`--outbox-database-url`), made on its
    event loop when called with the worker's namespace; None without one."""
    database_url = database_url or os.environ.get("OBSQ_OUTBOX_DATABASE_URL")
    if not database_url:
        return None
    if processes > 1:
        raise ConfigurationError("--outbox-database-url runs one relay beside one worker "
                                 "process: run `obsq outbox` apart from --processes workers")
    from obsq.outbox.process import relay_of

    return lambda namespace: relay_of(database_url, redis_url, namespace)


def cmd_outbox(args: argparse.Namespace) -> int:
    from obsq.observability import configure_logging
    from obsq.outbox.process import relay_of, run_relay

    configure_logging(args.log_format or os.environ.get("OBSQ_LOG_FORMAT", "text"),
                      os.environ.get("OBSQ_LOG_LEVEL", "INFO"))
    database_url = args.database_url or os.environ.get("OBSQ_DATABASE_URL")
    if not database_url:
        raise ConfigurationError("obsq outbox needs --database-url (OBSQ_DATABASE_URL): the "
                                 "SQLAlchemy URL of the database holding the outbox table")
    options: dict[str, Any] = {"table_name": args.table or os.environ.get("OBSQ_TABLE")
                               or "obsq_outbox"}
    batch = args.batch or os.environ.get("OBSQ_BATCH")
    if batch:
        options["batch"] = int(batch)
    poll_interval = args.poll_interval or os.environ.get("OBSQ_POLL_INTERVAL")
    if poll_interval:
        options["poll_interval"] = float(poll_interval)

    async def relay() -> None:  # the Client is made on the loop it runs on
        await run_relay(relay_of(database_url, _redis_url(args), _namespace(args), **options),
                        http_port=_http_port(args, OUTBOX_HTTP_PORT),
                        http_host=os.environ.get("OBSQ_HTTP_HOST", "0.0.0.0"))

    asyncio.run(relay())
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    from obsq.engine.scheduler import Scheduler
    from obsq.observability import (
        configure_logging,
        run_scheduler,
        setup_otel_metrics,
        setup_tracing,
        shutdown_otel_metrics,
        shutdown_tracing,
    )

    configure_logging(args.log_format or os.environ.get("OBSQ_LOG_FORMAT", "text"),
                      os.environ.get("OBSQ_LOG_LEVEL", "INFO"))
    # OBSQ_LOCK_TTL, OBSQ_MISSED_AFTER, OBSQ_ALLOW_EVICTION
    settings = SchedulerSettings.from_env(allow_eviction=args.allow_eviction)
    app = load_app(args.app)
    setup_tracing("obsq-scheduler")
    setup_otel_metrics("obsq-scheduler")
    namespace = args.namespace or os.environ.get("OBSQ_NAMESPACE")  # else the App's, as a worker
    try:
        asyncio.run(run_scheduler(Scheduler(app, _redis_url(args), namespace=namespace,
                                            settings=settings),
                                  http_port=_http_port(args, SCHEDULER_HTTP_PORT),
                                  http_host=os.environ.get("OBSQ_HTTP_HOST", "0.0.0.0")))
    finally:
        shutdown_tracing()
        shutdown_otel_metrics()
    return 0


def cmd_exporter(args: argparse.Namespace) -> int:
    from obsq.observability import (
        configure_logging,
        run_exporter,
        setup_otel_metrics,
        shutdown_otel_metrics,
    )

    configure_logging(os.environ.get("OBSQ_LOG_FORMAT", "text"),
                      os.environ.get("OBSQ_LOG_LEVEL", "INFO"))
    port = _http_port(args, EXPORTER_HTTP_PORT)
    setup_otel_metrics("obsq-exporter")
    try:
        asyncio.run(run_exporter(_redis_url(args), _namespace(args), port,
                                 host=os.environ.get("OBSQ_HTTP_HOST", "0.0.0.0")))
    finally:
        shutdown_otel_metrics()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from obsq.ops.demo import run_demo

    # the demo's worker reads the OBSQ_* settings as any worker does: a wrong one is said
    # before the demo starts, and it runs on the loop they choose
    settings = WorkerSettings.from_env()
    return eventloop.run(run_demo(args.redis_url or os.environ.get("OBSQ_REDIS_URL"),
                                  args.duration, args.http_port,
                                  args.namespace),  # not OBSQ_NAMESPACE: its keys go
                         settings.loop)


def cmd_acl(args: argparse.Namespace) -> int:
    from obsq.broker.acl import acl_rule

    print(acl_rule(_namespace(args), cluster=args.cluster))
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    from obsq.ops import admin

    return asyncio.run(admin.run(args.command, _redis_url(args), _namespace(args), args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="obsq", description="Redis task queue and worker")
    parser.add_argument("-V", "--version", action="version", version=f"obsq {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, handler: Any, namespace_help: str =
                "key prefix shared by producers and workers (OBSQ_NAMESPACE; default: the "
                "App's, else obsq)") -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("--redis-url", help="redis://[:password@]host:port/db, rediss://, "
                         "unix://, redis+cluster://, redis+sentinel:// (OBSQ_REDIS_URL)")
        sub.add_argument("--namespace", help=namespace_help)
        sub.set_defaults(handler=handler)
        return sub

    worker = command("worker", "run a worker (the production entry point)", cmd_worker)
    worker.add_argument("app", metavar="MODULE:APP")
    worker.add_argument("--queues", help="critical=6,default=3 (OBSQ_QUEUES)")
    worker.add_argument("--concurrency", type=int, help="task slots (OBSQ_CONCURRENCY, 50)")
    worker.add_argument("--route-concurrency", metavar="PATTERN=N,...",
                        help="this worker's limit per task type or prefix, the most specific "
                        "applying: pdf:render=2,pdf:=5,*=20 (OBSQ_ROUTE_CONCURRENCY)")
    worker.add_argument("--processes", type=int, help="worker processes (OBSQ_PROCESSES, 1)")
    worker.add_argument(LIFELINE_FLAG, type=int, help=argparse.SUPPRESS)
    worker.add_argument("--http-port", type=int,
                        help=f"metrics and probes (OBSQ_HTTP_PORT, {WORKER_HTTP_PORT}; "
                        "0: any free port, -1: none)")
    worker.add_argument("--lease-seconds", type=float, help="OBSQ_LEASE_SECONDS, 30")
    worker.add_argument("--shutdown-timeout", type=float, help="OBSQ_SHUTDOWN_TIMEOUT, 25")
    worker.add_argument("--max-recoveries", type=int, help="OBSQ_MAX_RECOVERIES, 5")
    worker.add_argument("--pool", choices=POOLS, help="where plain handlers run: threads, "
                        "or child processes killed when they overrun (OBSQ_POOL, thread)")
    worker.add_argument("--max-tasks-per-child", type=int, metavar="N",
                        help="replace a process of the process pool (else a worker process of "
                        "--processes) once it has run N tasks (OBSQ_MAX_TASKS_PER_CHILD, 0: "
                        "never)")
    worker.add_argument("--max-memory-per-child", type=int, metavar="MB",
                        help="replace such a process once its resident memory after a task is "
                        "above MB (OBSQ_MAX_MEMORY_PER_CHILD, 0: never)")
    worker.add_argument("--loop", choices=LOOPS, help="the event loop: uvloop where "
                        "installed (auto), or asyncio's own (OBSQ_LOOP, auto)")
    worker.add_argument("--stuck-limit", type=float, help="seconds a thread may stay stuck "
                        "in a handler past its timeout before liveness fails "
                        "(OBSQ_STUCK_LIMIT, 300)")
    worker.add_argument("--strict-priority", action="store_const", const=True,
                        help="always empty higher-weight queues first (OBSQ_STRICT_PRIORITY)")
    worker.add_argument("--log-format", choices=("text", "json"), help="OBSQ_LOG_FORMAT")
    worker.add_argument("--log-level", help="OBSQ_LOG_LEVEL, INFO")
    worker.add_argument("--no-metrics", action="store_true", help="OBSQ_METRICS=false")
    worker.add_argument("--no-queue-metrics", action="store_true",
                        help="leave the queue-wide gauges to `obsq exporter` "
                        "(OBSQ_QUEUE_METRICS=false)")
    worker.add_argument("--no-tracing", action="store_true", help="OBSQ_TRACING=false")
    worker.add_argument(*ALLOW_EVICTION, **ALLOW_EVICTION_OPTIONS)
    worker.add_argument("--outbox-database-url", metavar="URL",
                        help="also relay the outbox table of this database (obsq[outbox]) "
                        "to Redis, as `obsq outbox` does (OBSQ_OUTBOX_DATABASE_URL)")

    outbox = command("outbox", "move the committed rows of a transactional outbox "
                     "(obsq.outbox.Outbox) to Redis, in order, each once", cmd_outbox)
    outbox.add_argument("--database-url", metavar="URL", help="SQLAlchemy URL of the "
                        "database holding the table: postgresql://..., sqlite:///path "
                        "(OBSQ_DATABASE_URL)")
    outbox.add_argument("--table", help="the outbox table (OBSQ_TABLE, obsq_outbox)")
    outbox.add_argument("--batch", type=int, help="rows moved per round trip "
                        "(OBSQ_BATCH, 500)")
    outbox.add_argument("--poll-interval", type=float, help="seconds between looks for "
                        "rows when no notification comes (OBSQ_POLL_INTERVAL, 0.5; PostgreSQL "
                        "notifies at once)")
    outbox.add_argument("--log-format", choices=("text", "json"), help="OBSQ_LOG_FORMAT")
    outbox.add_argument("--http-port", type=int, help="/metrics, /healthz and /readyz "
                        f"(OBSQ_HTTP_PORT, {OUTBOX_HTTP_PORT}; 0: any free port, -1: none)")

    scheduler = command("scheduler", "fire the schedule entries, the App's and those added "
                        "at run time (safe with replicas)", cmd_scheduler)
    scheduler.add_argument("app", metavar="MODULE:APP")
    scheduler.add_argument("--log-format", choices=("text", "json"))
    scheduler.add_argument(*ALLOW_EVICTION, **ALLOW_EVICTION_OPTIONS)
    scheduler.add_argument("--http-port", type=int,
                           help="/healthz, /readyz and /metrics (OBSQ_HTTP_PORT, "
                           f"{SCHEDULER_HTTP_PORT}; 0: any free port, -1: none)")

    exporter = command("exporter", "serve only the queue-wide gauges on /metrics",
                       cmd_exporter)
    exporter.add_argument("--http-port", type=int,
                          help=f"OBSQ_HTTP_PORT, {EXPORTER_HTTP_PORT}; 0: any free port")

    demo = command("demo", "a worker, a producer and the HTTP endpoint in one process, in a "
                   "namespace of its own (obsq-demo-<random> unless --namespace names an "
                   "unused one) whose keys it removes at the end", cmd_demo,
                   namespace_help="an unused key prefix for the demo (default: "
                   "obsq-demo-<random>; OBSQ_NAMESPACE is not read, as the demo deletes "
                   "its namespace's keys)")
    demo.add_argument("--duration", type=float, default=12.0, help="seconds to run (12)")
    demo.add_argument("--http-port", type=int, default=WORKER_HTTP_PORT,
                      help=f"{WORKER_HTTP_PORT} (another free one when taken; 0: any free port)")

    acl = command("acl", "print the Redis ACL rules of a user that may run obsq on one "
                  "namespace and nothing else: ACL SETUSER NAME on >PASSWORD RULES", cmd_acl)
    acl.add_argument("--cluster", action="store_true",
                     help="with the commands a Redis Cluster client needs to find the nodes")
    add_admin_commands(command, cmd_admin)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 a failure at run time (Redis away or refusing, the App not
    importable, a port taken), 2 a wrong command line or setting (argparse's own too)."""
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "namespace", None) is not None:  # "" would otherwise mean the default
            validate_namespace(args.namespace)
        return args.handler(args)
    except (ConfigurationError, BrokerError) as exc:
        if isinstance(exc, BrokerError) and not exc.permission_denied:
            raise  # Redis away: its traceback says where (and Python exits 1)
        logging.basicConfig(format="%(message)s")  # a permission: Redis 6.2, no probe at start
        log.error("obsq %s: %s", args.command, exc)
        return 1 if isinstance(exc, (StartupError, BrokerError)) else 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `obsq stats | head -1`: the reader has all it wanted
        # Python would report the pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
