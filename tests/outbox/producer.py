"""A web app's producer, as a process of its own for the crash tests: N transactions, each
writing a row of its own `ledger` table and its task through the outbox, every fifth one
rolled back instead; then it SIGKILLs itself right after its last commit, as a process
that dies before it could do anything else.

    python tests/outbox/producer.py DATABASE_URL TABLE N
"""

from __future__ import annotations

import os
import signal
import sys

from sqlalchemy import Column, MetaData, String, Table, insert

from obsq.outbox import Outbox
from obsq.outbox.relay import sync_engine

LEDGER = "ledger"


def ledger_table(metadata: MetaData, outbox_table: str) -> Table:
    return Table(f"{outbox_table}_{LEDGER}", metadata, Column("task_id", String(255)))


def main(database_url: str, table_name: str, count: int) -> None:
    engine = sync_engine(database_url)
    outbox = Outbox(engine, table_name=table_name)
    ledger = ledger_table(MetaData(), table_name)
    for n in range(count):
        with engine.connect() as conn:
            transaction = conn.begin()
            task_id = outbox.enqueue(conn, "order:placed", {"n": n}, queue="orders")
            conn.execute(insert(ledger).values(task_id=task_id))
            if n % 5 == 4:
                transaction.rollback()
            else:
                transaction.commit()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
