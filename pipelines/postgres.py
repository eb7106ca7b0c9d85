"""The instance's PostgreSQL (DAGSTER_POSTGRES_URL): is it there, and one migration at a time.

Dagster's own storage retries a refused connection for a while and then fails with a trace;
an operator needs one line naming the server and what to check, before anything is written.
The URL holds a password: messages name the host, port and database, never the URL.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from connectors.clinical_records import postgres as pg
from connectors.clinical_records.postgres import POSTGRES_VARIABLE, PostgresRefused

if TYPE_CHECKING:
    from dagster import DagsterInstance

CONNECT_TIMEOUT_SECONDS = 5
# A process that executes runs or steps keeps its connections to the instance
# (`hold_connections`): a pool of one per storage, a few more while threads need them, each
# replaced after five minutes (a proxy between may drop an idle one). A deployment's budget:
# up to 3 per run worker and per step process, and Dagster's own for the webserver.
HELD_OVERFLOW = 4
HELD_RECYCLE_SECONDS = 300
_HELD: weakref.WeakSet[DagsterInstance] = weakref.WeakSet()  # instances already holding them
# pg_advisory_lock key held while one process creates or migrates Dagster's tables; any fixed
# 64-bit number no other program of this database uses.
MIGRATION_LOCK = 0x636C696E6963616C  # "clinical"


class PostgresUnreachable(Exception):
    """The instance's PostgreSQL cannot be used: the server, the login or the database."""


def where(url: str) -> str:
    """`host:port/database` of a URL, without its user or password."""
    try:
        return pg.place(url)
    except ValueError as error:
        raise PostgresUnreachable(str(error)) from None


def connect(url: str):
    """A psycopg2 connection, or PostgresUnreachable naming the server and what to check."""
    place = where(url)
    try:
        return pg.connect(url, CONNECT_TIMEOUT_SECONDS)
    except PostgresRefused as refused:
        raise PostgresUnreachable(
            f"cannot use the Dagster instance's PostgreSQL at {place} ({POSTGRES_VARIABLE}): "
            f"{refused.reason}; {refused.advice}"
        ) from None


@contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Held while this process creates or upgrades Dagster's tables: the processes of every
    host (CLI, webserver, daemon, workers) start one at a time through it."""
    connection = connect(url)
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        yield
    finally:
        connection.close()  # the session's advisory lock ends with it


def hold_connections(instance: DagsterInstance) -> None:
    """Keep this process's connections to the instance's PostgreSQL for its life.

    Dagster's PostgreSQL storages open a connection for every statement (NullPool), except in
    the webserver, which `optimize_for_webserver` gives a pool of one per storage. A tenant's
    run made about 1,300 (each a server process forked and a login): ten tenants at once spent
    more CPU connecting than syncing (benchmarks/tenants_parallel.py --postgres: 95 s against
    41 s held). Only a process that executes runs or steps and forks no child after (Dagster
    spawns a run's step processes, it does not fork them): `sync --all-tenants` forks with the
    instance open (pipelines/home.py, `inherited`), and a connection held then would be shared
    by every child. Statement timeout 0: a run's query is never cut short.
    Once per instance (a second call would replace the pools it holds); nothing on SQLite."""
    from dagster_postgres import PostgresRunStorage

    if instance in _HELD or not isinstance(instance.run_storage, PostgresRunStorage):
        return
    instance.optimize_for_webserver(
        statement_timeout=0, pool_recycle=HELD_RECYCLE_SECONDS, max_overflow=HELD_OVERFLOW
    )
    _HELD.add(instance)
