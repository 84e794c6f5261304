"""The chaos scenarios, each against real servers it starts on loopback. Each returns its
Outcome lines (harness.py defines the figures); `quick` runs the short version the test
suite runs (short heartbeat intervals, shorter faults), else production intervals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from obsq.redis_server import RedisServer, free_port

from .harness import (
    Ledger,
    Outcome,
    Producer,
    Sentinels,
    Workers,
    libfaketime,
    outcome,
    redis_server,
    settle,
    started_again_unkilled,
    takeover_times,
)

NS = "chaos"
PRODUCTION_TTL = 10.0  # the default heartbeat TTL: how long a killed worker's tasks wait


async def workers(tasks: int, workdir: Path, quick: bool) -> list[Outcome]:
    """4 worker processes; every 2 s (0.5 s quick) one is SIGKILLed and another started,
    while the tasks are enqueued and drained. Recovery: the longest a killed worker's task
    waited until it ran again."""
    server = redis_server().start()
    pool = Workers(server.url, NS, workdir, quick=quick, OBSQ_CHAOS_WORK_SECONDS="0.02",
                   concurrency=10)
    producer = Producer(server.url, NS)
    ledger = Ledger(workdir / "ledger")
    try:
        pool.start(4)
        await pool.ready()
        producing = asyncio.create_task(producer.run(tasks, batch=200, pause=0.01))
        while not producing.done() or len(ledger.read().ends) < 0.9 * len(producer.acked):
            await asyncio.sleep(0.5 if quick else 2.0)
            pool.kill(random.choice(pool.running))
            pool.start()
        await producing
        await settle(ledger, producer.acked, quiet=_quiet(quick), deadline=300)
        return [outcome("workers", producer.acked, ledger, await pool.doctor(),
                        max(takeover_times(ledger, pool.kills), default=None),
                        kills=len(pool.kills),
                        started_again_without_a_kill=started_again_unkilled(ledger,
                                                                           pool.kills))]
    finally:
        await producer.close()
        pool.close()
        server.close()


async def redis_restart(tasks: int, workdir: Path, quick: bool,
                        modes: tuple[str, ...] = ("always", "everysec", "no")
                        ) -> list[Outcome]:
    """Redis SIGKILLed and started again mid-run, producers and workers running: with
    `appendonly yes` and each `appendfsync` mode, and `appendonly no` (the reference: a
    Redis that keeps nothing). Recovery: from the kill until a task fetched after it
    completes."""
    outcomes = []
    for mode in modes:
        config = {"appendonly": "no"} if mode == "no" else {"appendonly": "yes",
                                                              "appendfsync": mode}
        run_dir = workdir / f"restart-{mode}"
        server = redis_server(config=config).start()
        pool = Workers(server.url, NS, run_dir, quick=quick, **_slow(quick))
        producer = Producer(server.url, NS)
        ledger = Ledger(run_dir / "ledger")
        try:
            async def crash_and_restart(server: RedisServer = server) -> None:
                server.stop()
                server.start()

            killed = await _fault_under_load(pool, producer, ledger, tasks, quick,
                                             2 if quick else 10, crash_and_restart)
            name = "appendonly no" if mode == "no" else f"appendfsync {mode}"
            outcomes.append(outcome(f"redis-restart ({name})", producer.acked, ledger,
                                    await pool.doctor(),
                                    _flowing_again(ledger, killed),
                                    refused_batches=producer.refusals))
        finally:
            await producer.close()
            pool.close()
            server.close()
    return outcomes


async def failover(tasks: int, workdir: Path, quick: bool,
                   durable: tuple[int, ...] = (0, 1)) -> list[Outcome]:
    """A master, a replica and three Sentinels; the master is SIGKILLed mid-run, the
    replica promoted, and the old master started again (the Sentinels make it the new
    replica). Without durable_replicas an enqueue acknowledged by the master may not have
    reached the replica; with `durable_replicas=1` each enqueue waits for it (and is
    refused while there is no replica).
    Recovery: from the kill until a task fetched after it completes."""
    return [await _failover_once(tasks, workdir / f"failover-{n}", quick, n) for n in durable]


async def _failover_once(tasks: int, run_dir: Path, quick: bool, replicas: int) -> Outcome:
    run_dir.mkdir(parents=True)
    master = redis_server(config={"repl-diskless-sync-delay": 0}).start()
    replica = redis_server(config={"replicaof": f"127.0.0.1 {master.port}",
                                  "repl-diskless-sync-delay": 0}).start()
    sentinels = Sentinels(master.port, run_dir)
    pool = Workers(sentinels.url, NS, run_dir, quick=quick, **_slow(quick))
    producer = Producer(sentinels.url, NS, **({"durable_replicas": replicas} if replicas else {}))
    ledger = Ledger(run_dir / "ledger")
    try:
        await _until(lambda: _sentinels_ready(sentinels), 30, "the Sentinels to agree")
        one_at_a_time = await producer.latency(200)
        promoted = 0.0

        async def fail_over() -> None:
            nonlocal promoted
            began = time.monotonic()
            master.stop()
            await _until(lambda: _promoted(sentinels, replica.port), 60, "the promotion")
            promoted = time.monotonic() - began
            master.start()  # back, empty: the Sentinels make it the new master's replica

        killed = await _fault_under_load(pool, producer, ledger, tasks, quick,
                                         6 if quick else 12, fail_over)
        return outcome(f"failover (durable_replicas={replicas})", producer.acked, ledger,
                       await pool.doctor(),
                       _flowing_again(ledger, killed),
                       promoted_after=round(promoted, 2),
                       refused_batches=producer.refusals,
                       enqueue_one_at_a_time_ms=round(one_at_a_time * 1000, 3))
    finally:
        await producer.close()
        pool.close()
        sentinels.close()
        master.close()
        replica.close()


async def hang(tasks: int, workdir: Path, quick: bool, seconds: float = 5.0
               ) -> list[Outcome]:
    """Redis frozen for `seconds` (CLIENT PAUSE ALL) under load, workers with the
    production heartbeat TTL and leases: no task may start twice, and /readyz must say
    Redis is not answering. Recovery: from the end of the freeze until a task fetched
    after it completes."""
    server = redis_server().start()
    pool = Workers(server.url, NS, workdir, quick=quick, OBSQ_HEARTBEAT_INTERVAL="1",
                   OBSQ_HEARTBEAT_TTL=str(PRODUCTION_TTL), OBSQ_LEASE_SECONDS="30")
    producer = Producer(server.url, NS)
    ledger = Ledger(workdir / "ledger")
    try:
        port = free_port()
        pool.start(1, http_port=port)
        pool.start(1)
        await _until(lambda: _readyz(port)[0] == 200, 30, "the worker to be ready")
        producing = asyncio.create_task(
            producer.run(tasks, batch=10, pause=_pace(tasks, 10, seconds + (2 if quick else 4))))
        await asyncio.sleep(1 if quick else 2)
        admin = redis.Redis.from_url(server.url)
        admin.client_pause(int(seconds * 1000))
        frozen = time.monotonic()
        reports = []
        while time.monotonic() < frozen + seconds:
            reports.append(await asyncio.to_thread(_readyz, port))
            await asyncio.sleep(0.25)
        thawed = frozen + seconds
        admin.close()
        await producing
        await settle(ledger, producer.acked, quiet=_quiet(quick), deadline=120)
        said = next((body for status, body in reports if status == 503), "")
        return [outcome(f"hang ({seconds:g} s)", producer.acked, ledger, await pool.doctor(),
                        _flowing_again(ledger, thawed),
                        started_again_without_a_kill=started_again_unkilled(ledger, {}),
                        readyz_during_the_freeze=said or "never 503")]
    finally:
        await producer.close()
        pool.close()
        server.close()


async def full(tasks: int, workdir: Path, quick: bool) -> list[Outcome]:
    """Redis at maxmemory with noeviction: producers fill it until refused; workers then
    start on the full Redis and drain it while producers keep trying. Recovery: from the
    workers' start until an enqueue is accepted again."""
    server = redis_server(config={"maxmemory": "3mb" if quick else "16mb",
                                 "maxmemory-policy": "noeviction"}).start()
    pool = Workers(server.url, NS, workdir, quick=quick)
    producer = Producer(server.url, NS)
    ledger = Ledger(workdir / "ledger")
    admin = redis.Redis.from_url(server.url)
    try:
        await producer.run(10**9, batch=100, until=lambda: producer.refusals > 0)
        memory = admin.info("memory")
        share = memory["used_memory"] / memory["maxmemory"]
        queued = len(producer.acked)
        pool.start(2)
        started = time.monotonic()
        await producer.run(producer.next + tasks, batch=100, until_accepted=True)
        accepted_again = min((sent for n, sent in producer.acked.items() if n >= queued),
                             default=None)
        await settle(ledger, producer.acked, quiet=_quiet(quick), deadline=300)
        return [outcome("full (noeviction)", producer.acked, ledger, await pool.doctor(),
                        accepted_again - started if accepted_again else None,
                        queued_when_full=queued, refused_batches=producer.refusals,
                        refused_at_share_of_maxmemory=f"{share:.0%}",
                        refusal=producer.errors.get("out of memory", "none"))]
    finally:
        admin.close()
        await producer.close()
        pool.close()
        server.close()


async def skew(tasks: int, workdir: Path, quick: bool, offset: str = "+30s"
               ) -> list[Outcome]:
    """A worker whose clock is 30 s ahead (libfaketime) beside one on time; half the tasks
    are delayed 1 s. The skewed worker is SIGKILLed mid-run. No delayed task may start
    early, and the skewed worker's tasks must come back within the heartbeat TTL
    (recovery: the longest they waited)."""
    library = libfaketime()
    if library is None:
        raise FileNotFoundError("libfaketime is not installed (Debian package faketime)")
    server = redis_server().start()
    pool = Workers(server.url, NS, workdir, quick=quick, OBSQ_CHAOS_WORK_SECONDS="0.2")
    producer = Producer(server.url, NS)
    ledger = Ledger(workdir / "ledger")
    try:
        pool.start(1)
        skewed, = pool.start(1, LD_PRELOAD=library, FAKETIME=offset,
                             FAKETIME_DONT_FAKE_MONOTONIC="1")
        await pool.ready()
        half = tasks // 2
        await producer.run(half, batch=10, pause=_pace(half, 10, 1.5), delay=1.0)
        producing = asyncio.create_task(
            producer.run(tasks, batch=10, pause=_pace(half, 10, 3)))

        def ran_by_skewed(runs: dict[int, list[tuple[float, int]]]) -> int:
            return sum(1 for each in runs.values() for _, pid in each if pid == skewed.pid)

        def running_on_skewed() -> bool:
            ledger.read()
            return ran_by_skewed(ledger.starts) > ran_by_skewed(ledger.ends)

        await asyncio.sleep(0.5)
        await _until(running_on_skewed, 30, "the skewed worker to run tasks")
        ran_before_its_kill = ran_by_skewed(ledger.starts)
        pool.kill(skewed)
        await producing
        await settle(ledger, producer.acked, quiet=_quiet(quick), deadline=120)
        early = sum(1 for n, sent in producer.acked.items() if n < half and n in ledger.starts
                    and min(at for at, _ in ledger.starts[n]) < sent + 1.0)
        return [outcome(f"skew ({offset})", producer.acked, ledger, await pool.doctor(),
                        max(takeover_times(ledger, pool.kills), default=None),
                        started_by_the_skewed_worker_before_its_kill=ran_before_its_kill,
                        delayed_tasks_started_early=early,
                        started_again_without_a_kill=started_again_unkilled(ledger,
                                                                           pool.kills))]
    finally:
        await producer.close()
        pool.close()
        server.close()


async def blocked_loop(tasks: int, workdir: Path, quick: bool, seconds: float = 15.0
                       ) -> list[Outcome]:
    """Two workers with the production heartbeat TTL and lease (quick: the short ones and a
    3 s lease); one task in 200 calls time.sleep(`seconds`, 4 s quick) in its async handler,
    blocking its worker's event loop past the heartbeat TTL, while the others await 0.5 s
    of I/O under a 2 s timeout. No task may start twice (a lease taken from a live worker)
    or time out; each blocking is logged with its task."""
    block = 4.0 if quick else seconds
    server = redis_server().start()
    pool = Workers(server.url, NS, workdir, quick=quick, OBSQ_CHAOS_WORK_SECONDS="0.5",
                   OBSQ_CHAOS_TIMEOUT="2", OBSQ_CHAOS_BLOCK_EVERY="200",
                   OBSQ_CHAOS_BLOCK_SECONDS=str(block),
                   OBSQ_LEASE_SECONDS="3" if quick else "30")
    producer = Producer(server.url, NS)
    ledger = Ledger(workdir / "ledger")
    try:
        pool.start(2)
        await pool.ready()
        await producer.run(tasks, batch=10, pause=_pace(tasks, 10, 2 * block))
        await settle(ledger, producer.acked, quiet=_quiet(quick) + block, deadline=300)
        logs = "".join(p.log() for p in pool.all)
        return [outcome(f"blocked loop ({block:g} s)", producer.acked, ledger,
                        await pool.doctor(), None,
                        blocking_tasks=sum(1 for n in producer.acked if n % 200 == 199),
                        blockings_logged=logs.count("the event loop has been blocked for"),
                        started_again_without_a_kill=started_again_unkilled(ledger, {}),
                        timed_out=logs.count("longer than its timeout"))]
    finally:
        await producer.close()
        pool.close()
        server.close()


SCENARIOS = {"workers": workers, "redis-restart": redis_restart, "failover": failover,
             "hang": hang, "full": full, "skew": skew, "blocked-loop": blocked_loop}


async def _fault_under_load(pool: Workers, producer: Producer, ledger: Ledger, tasks: int,
                            quick: bool, seconds: float, fault: Any) -> float:
    """Two workers, `tasks` enqueued over `seconds` in batches of 10, `await fault()` after
    1.5 s (5 s long) of it; then the rest enqueued and the queue settled. -> when the fault
    began."""
    pool.start(2)
    await pool.ready()
    producing = asyncio.create_task(
        producer.run(tasks, batch=10, pause=_pace(tasks, 10, seconds)))
    await asyncio.sleep(1.5 if quick else 5)
    began = time.monotonic()
    await fault()
    await producing
    await settle(ledger, producer.acked, quiet=_quiet(quick), deadline=120)
    return began


def _slow(quick: bool) -> dict[str, Any]:
    """Workers slower than the producers, so that a backlog is queued when Redis fails (2 x
    10 slots of 100 ms tasks take 200 tasks/s), with leases shorter than the settling's
    quiet time: a fetch whose reply a crash lost leaves its tasks leased until then."""
    return {"OBSQ_CHAOS_WORK_SECONDS": "0.1", "concurrency": 10,
            "OBSQ_LEASE_SECONDS": "3" if quick else "10"}


def _quiet(quick: bool) -> float:
    """How long without a completion means the rest is lost: past a killed worker's
    heartbeat TTL and the sweeps."""
    return (3.0 if quick else PRODUCTION_TTL) + 5.0


def _pace(tasks: int, batch: int, seconds: float) -> float:
    """The pause between batches that spreads `tasks` over about `seconds`."""
    return seconds / max(tasks / batch, 1)


def _flowing_again(ledger: Ledger, moment: float) -> float | None:
    """From `moment` until a task fetched after it completed: Redis serves workers again
    (whatever backlog the queue holds)."""
    ends = [end for n, runs in ledger.ends.items() for end, _ in runs
            if any(moment < start <= end for start, _ in ledger.starts.get(n, ()))]
    return min(ends) - moment if ends else None


async def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await asyncio.to_thread(condition):
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.1)


def _sentinels_ready(sentinels: Sentinels) -> bool:
    for port in sentinels.ports:
        with redis.Redis(port=port) as s:
            master = s.sentinel_master("obsq")
            if master["num-slaves"] < 1 or master["num-other-sentinels"] < 2:
                return False
    return True


def _promoted(sentinels: Sentinels, port: int) -> bool:
    with redis.Redis(port=sentinels.ports[0]) as s:
        return int(s.sentinel_get_master_addr_by_name("obsq")[1]) == port


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        with contextlib.suppress(ValueError):
            body = json.loads(body).get("reason", body)
        return exc.code, body
    except OSError:
        return 0, ""

