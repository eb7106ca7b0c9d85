"""A throwaway PostgreSQL server for tests and benchmarks: Debian's `initdb` and `pg_ctl`.

The server lives in a temporary folder, listens on 127.0.0.1 on a free port (its unix socket in
the same folder), accepts one role with a random password, and is stopped and removed at the
end. PostgreSQL refuses to run as root, so as root (CI) every server command runs as the
`postgres` account the Debian package creates, and the folder belongs to it.

`postgres_server()` starts one; `PostgresServer.database()` makes a fresh database on it, so
that each test's Dagster instance and rate-limit table start empty.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

from tests.dev_server import free_port

INSTALL_HINT = "PostgreSQL is not installed: apt-get install postgresql"
SERVER_ACCOUNT = "postgres"  # created by Debian's postgresql-common
ROLE = "clinical"
START_TIMEOUT_SECONDS = 60
# A test server: durability off (a crash loses only test data), room for a webserver, a daemon,
# code servers and every step process of several runs.
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
}


def binaries() -> Path | None:
    """The newest `/usr/lib/postgresql/<version>/bin` that holds initdb, or None."""
    found = [
        p.parent
        for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")
        if p.parent.parent.name.isdigit()
    ]
    return max(found, key=lambda p: int(p.parent.name)) if found else None


@dataclass
class PostgresServer:
    """A running server; `url` names its first database."""

    host: str
    port: int
    password: str = field(repr=False)
    root: Path
    _numbers: Iterator[int] = field(default_factory=lambda: count(1), repr=False)

    def url_of(self, database: str) -> str:
        return f"postgresql://{ROLE}:{self.password}@{self.host}:{self.port}/{database}"

    @property
    def url(self) -> str:
        return self.url_of(ROLE)

    def database(self, prefix: str = "test") -> str:
        """A new, empty database; its URL."""
        import psycopg2

        name = f"{prefix}_{os.getpid()}_{next(self._numbers)}"
        connection = psycopg2.connect(self.url)
        try:
            connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url_of(name)


def _as_server_account(cmd: list[str]) -> list[str]:
    """`cmd` as the account that may run PostgreSQL: ourselves, or `postgres` when root."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", SERVER_ACCOUNT, "--", *cmd]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(
        _as_server_account(cmd), capture_output=True, text=True, timeout=START_TIMEOUT_SECONDS
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({done.returncode}):\n{done.stderr}")


@contextmanager
def postgres_server(bin_dir: Path | None = None) -> Iterator[PostgresServer]:
    """Start a server in a new temporary folder; stop it and remove the folder at the end."""
    bin_dir = bin_dir or binaries()
    if bin_dir is None:
        raise FileNotFoundError(INSTALL_HINT)
    root = Path(tempfile.mkdtemp(prefix="clinical-pg-"))
    data, password = root / "data", secrets.token_urlsafe(16)
    fd = os.open(root / "pwfile", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, user=SERVER_ACCOUNT)
        shutil.chown(root / "pwfile", user=SERVER_ACCOUNT)
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                ROLE,
                f"--pwfile={root / 'pwfile'}",
                "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-sync",
            ]
        )
        port = free_port()
        options = " ".join(f"-c {k}={v}" for k, v in {**SERVER_SETTINGS, "port": port}.items())
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-o",
                f"{options} -k {root}",
                "-w",
                "-t",
                str(START_TIMEOUT_SECONDS),
                "start",
            ]
        )
        try:
            server = PostgresServer("127.0.0.1", port, password, root)
            _create_first_database(server)
            yield server
        finally:
            _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _create_first_database(server: PostgresServer) -> None:
    """The role's own database, which `url` names (initdb makes only `postgres`)."""
    import psycopg2

    connection = psycopg2.connect(server.url_of("postgres"))
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{ROLE}"')
    finally:
        connection.close()
