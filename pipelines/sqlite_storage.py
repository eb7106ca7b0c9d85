"""Dagster's SQLite instance storage, one SQLAlchemy engine per database file, each keeping
a connection open between uses.

Dagster's SQLite storages (1.13) build a new SQLAlchemy engine for every connection they open
(the event log's `_connect` and `has_table`, the run and schedule storages' `connect`): one
tenant's run opens about 2,000, and each new engine starts with an empty cache of compiled
statements, so every statement is compiled again. And each connection is a new SQLite
connection (NullPool): opening a file Dagster keeps in WAL mode maps its shared memory, and
closing the last connection checkpoints the log. One insert and commit cost 670 us of CPU
that way against 200 us on a kept connection (a SQLAlchemy loop over a WAL file). Ten tenants
on one machine wait for exactly that CPU (benchmarks/tenants_parallel.py): with one engine
per file the tenant alone took 8.0 CPU s against 9.3; keeping a connection, ten tenants at
once took 37.1/36.4 CPU s against 49.6/44.9 (the benchmark's ten, alternated, one sitting;
docs/SIZING.md).

These subclasses change nothing else: the same busy timeout, the same files, Dagster's own
schema creation and migrations. A kept connection holds no lock between uses (SQLite locks
for a transaction only); more than one at a time (the webserver's threads) are opened as
needed and closed after. No connection is ever open in two processes (`sync --all-tenants`
forks with the instance open): a process about to fork closes the ones it keeps, and the child
forgets any its parent had in use. A home's `dagster.yaml` (pipelines/home.py) selects
`SqliteStorage`; on PostgreSQL Dagster keeps one engine already, and a process that runs
holds its connections (pipelines/postgres.py).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import yaml
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SqliteEventLogStorage as DagsterSqliteEventLogStorage,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import (
    SqliteRunStorage as DagsterSqliteRunStorage,
)
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import (
    SqliteScheduleStorage as DagsterSqliteScheduleStorage,
)
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.pool import QueuePool

# Engines kept per process: a run's own file, the index and a few others; the webserver, which
# reads many runs' files, keeps the most recently used.
ENGINES_KEPT = 32


# Every engine this process made: their connections closed before a fork, forgotten after it.
_MADE: weakref.WeakSet[Engine] = weakref.WeakSet()


def _engine(conn_string: str) -> Engine:
    """One connection kept; any more at once opened as needed and closed after use."""
    engine = create_engine(
        conn_string,
        poolclass=QueuePool,
        pool_size=1,
        max_overflow=-1,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
    )
    _MADE.add(engine)
    return engine


def _close_kept_connections() -> None:
    """Before a fork: the connections kept between uses are closed, so that none is open in
    both processes (SQLite's advice: never carry an open connection across a fork)."""
    for engine in list(_MADE):
        engine.dispose()


def _forget_connections() -> None:
    """In a forked child: new, empty pools; a connection the parent had in use at the fork is
    left to the parent (not closed here: that would act on the parent's)."""
    for engine in list(_MADE):
        engine.dispose(close=False)


os.register_at_fork(before=_close_kept_connections, after_in_child=_forget_connections)


class SqliteEventLogStorage(DagsterSqliteEventLogStorage):
    """Events in one SQLite file per run and an index file, as Dagster keeps them."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_lock = threading.Lock()  # not Dagster's _db_lock: has_table runs inside it
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, str]
    ) -> SqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def _engine_for(self, shard: str) -> Engine:
        """The shard's engine, made on first use; the least recently used one closed past
        ENGINES_KEPT."""
        conn_string = self.conn_string_for_shard(shard)
        with self._engines_lock:
            engine = self._engines.pop(conn_string, None) or _engine(conn_string)
            self._engines[conn_string] = engine
            while len(self._engines) > ENGINES_KEPT:
                self._engines.popitem(last=False)[1].dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine_for(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def has_table(self, table_name: str) -> bool:
        engine = self._engine_for(INDEX_SHARD_NAME)
        with engine.connect() as conn:
            return bool(engine.dialect.has_table(conn, table_name))

    def _close_engines(self) -> None:
        with self._engines_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()

    def wipe(self) -> None:
        self._close_engines()  # no connection left on a file about to be deleted
        super().wipe()

    def dispose(self) -> None:
        super().dispose()
        self._close_engines()


class OneEngine:
    """For a storage in one file (`_conn_string`): its engine, made on first use."""

    _conn_string: str
    _kept: Engine | None = None

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        if self._kept is None:
            self._kept = _engine(self._conn_string)
        with self._kept.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        if self._kept is not None:
            self._kept.dispose()

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, str]
    ) -> OneEngine:
        return cls.from_local(inst_data=inst_data, **config_value)  # type: ignore[attr-defined]


class SqliteRunStorage(OneEngine, DagsterSqliteRunStorage):
    """Runs in `history/runs.db`, as Dagster keeps them."""


class SqliteScheduleStorage(OneEngine, DagsterSqliteScheduleStorage):
    """Schedules, sensors and their ticks in `schedules/schedules.db`, as Dagster keeps them."""


def _data(cls: type, base_dir: str) -> ConfigurableClassData:
    return ConfigurableClassData(
        cls.__module__, cls.__name__, yaml.safe_dump({"base_dir": base_dir})
    )


class SqliteStorage(DagsterSqliteStorage):
    """The instance's storage on one machine: Dagster's SQLite layout under `base_dir`
    (`history/runs.db`, `history/runs/<run>.db`, `schedules/schedules.db`)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        # Dagster's __init__ would open its own three storages first; ours replace them.
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = SqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, str]
    ) -> SqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)

    @property
    def event_storage_data(self) -> ConfigurableClassData:
        return _data(SqliteEventLogStorage, _event_logs_directory(self.base_dir))

    @property
    def run_storage_data(self) -> ConfigurableClassData:
        return _data(SqliteRunStorage, _runs_directory(self.base_dir))

    @property
    def schedule_storage_data(self) -> ConfigurableClassData:
        return _data(SqliteScheduleStorage, _schedule_directory(self.base_dir))
