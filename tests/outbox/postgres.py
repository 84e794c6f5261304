"""A private PostgreSQL cluster for the outbox's tests and benchmark: Debian's
`postgresql` binaries, initdb and pg_ctl run as the `postgres` user when the tests run as
root (PostgreSQL refuses to run as root), on a free port, its files in a temporary
directory removed at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def postgres_bin(name: str) -> str | None:
    """The newest Debian PostgreSQL's `name` (initdb, pg_ctl), else PATH's."""
    for directory in BIN_DIRS:
        if (directory / name).exists():
            return str(directory / name)
    return shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    """`start()` initdb's a cluster and starts it; `url` is its SQLAlchemy URL (psycopg);
    `stop()` stops it and removes its files."""

    def __init__(self, *, durable: bool = False) -> None:
        """`durable`: fsync as a production server does (the benchmark); the tests skip it."""
        self.durable = durable
        self.directory = Path(tempfile.mkdtemp(prefix="obsq-pg-"))
        self.port = _free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = list(args)
        if os.geteuid() == 0:  # PostgreSQL will not run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)

    def start(self) -> PostgresCluster:
        initdb, pg_ctl = postgres_bin("initdb"), postgres_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise FileNotFoundError("no initdb/pg_ctl: apt-get install postgresql")
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        data = self.directory / "data"
        self._run(initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                  "--no-sync")
        self._run(pg_ctl, "-D", str(data), "-l", str(self.directory / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                  f"-c fsync={'on' if self.durable else 'off'} -c max_connections=200",
                  "start")
        return self

    def stop(self) -> None:
        pg_ctl = postgres_bin("pg_ctl")
        if pg_ctl is not None and (self.directory / "data" / "postmaster.pid").exists():
            self._run(pg_ctl, "-D", str(self.directory / "data"), "-m", "immediate", "-w",
                      "stop")
        shutil.rmtree(self.directory, ignore_errors=True)
