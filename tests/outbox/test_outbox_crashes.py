"""Crashes, with real processes: a producer that SIGKILLs itself right after its last
commit, and relays (`obsq outbox`) SIGKILLed again and again while they move rows. At the
end every committed transaction's task is in Redis exactly once, and no rolled-back one."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import MetaData, func, select
from support import ROOT, ObsqProcess, obsq_env, sync_redis, wait_for

from obsq.outbox import Outbox
from obsq.outbox.relay import sync_engine
from outbox.producer import ledger_table

ROWS = 1500


def start_relay(database_url: str, table_name: str, redis_url: str, namespace: str,
                log_path: Path) -> ObsqProcess:
    return ObsqProcess(["outbox", "--database-url", database_url, "--table", table_name,
                        "--redis-url", redis_url, "--namespace", namespace, "--batch", "20",
                        "--poll-interval", "0.05", "--http-port", "-1"],
                       obsq_env(), ROOT, log_path)


@pytest.mark.slow
def test_killed_producers_and_relays_lose_nothing_and_double_nothing(
        database_url: str, table_name: str, admin_redis_url: str, namespace: str,
        tmp_path: Path) -> None:
    engine = sync_engine(database_url)
    metadata = MetaData()
    outbox = Outbox(engine, table_name=table_name, metadata=metadata)
    ledger = ledger_table(metadata, table_name)
    metadata.create_all(engine)
    producer = subprocess.Popen([sys.executable, str(Path(__file__).parent / "producer.py"),
                                 database_url, table_name, str(ROWS)], env=obsq_env(),
                                cwd=ROOT, stdin=subprocess.DEVNULL)
    kills = 0
    relays: list[ObsqProcess] = []
    try:
        while producer.poll() is None or kills < 3:  # relays killed as rows keep coming
            relay = start_relay(database_url, table_name, admin_redis_url, namespace,
                                tmp_path / f"relay-{kills}.log")
            relays.append(relay)
            time.sleep(random.uniform(0.3, 1.2))  # a start is about 0.5 s of it
            relay.signal(signal.SIGKILL)
            relay.wait()
            kills += 1
        producer.wait(60)
        assert producer.returncode == -signal.SIGKILL  # it killed itself after its commit
        relay = start_relay(database_url, table_name, admin_redis_url, namespace,
                            tmp_path / "relay-last.log")
        relays.append(relay)
        # stopped below once started: a SIGTERM before its handlers are in place is a kill
        wait_for(lambda: "started: moving committed rows" in relay.log(), timeout=30,
                 what="the last relay to start")
        deadline = time.monotonic() + 60
        with engine.connect() as conn:
            while conn.scalar(select(func.count()).select_from(outbox.table)):
                assert time.monotonic() < deadline, relay.log()
                time.sleep(0.1)
                conn.rollback()  # a fresh snapshot for the next count
        assert relay.stop() == 0, relay.log()
    finally:
        if producer.poll() is None:
            producer.kill()
        for r in relays:
            r.close()
    with engine.connect() as conn:
        committed = set(conn.scalars(select(ledger.c.task_id)).all())
    redis = sync_redis(admin_redis_url)
    enqueued = [i.decode() for i in redis.lrange(f"{namespace}:{{orders}}:pending", 0, -1)]
    assert kills >= 2
    assert len(committed) == ROWS * 4 // 5
    assert len(enqueued) == len(set(enqueued)) == len(committed)  # nothing doubled
    assert set(enqueued) == committed  # nothing lost, nothing rolled back
    engine.dispose()
