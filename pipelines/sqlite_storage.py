"""Dagster's SQLite instance storage, one SQLAlchemy engine per database file.

Dagster's SQLite storages (1.13) build a new SQLAlchemy engine for every connection they open
(the event log's `_connect` and `has_table`, the run and schedule storages' `connect`): one
tenant's run opens about 2,450, and each new engine starts with an empty cache of compiled
statements, so every statement is compiled again. With one engine per file the tenant alone
took 8.0 CPU s against 9.3 (three runs each, the command's imports included), and ten tenants
on one machine wait for exactly that CPU (benchmarks/tenants_parallel.py).

These subclasses keep one engine per file and change nothing else: the same NullPool (a fresh
SQLite connection for every use, closed after it, exactly as Dagster opens them, so processes
and forked children never share a connection), the same busy timeout, the same files, and
Dagster's own schema creation and migrations. A home's `dagster.yaml` (pipelines/home.py)
selects `SqliteStorage`; on PostgreSQL Dagster keeps one engine already, and a process that
runs holds its connections (pipelines/postgres.py).
"""

from __future__ import annotations

import threading
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
from sqlalchemy.pool import NullPool

# Engines kept per process: a run's own file, the index and a few others; the webserver, which
# reads many runs' files, keeps the most recently used.
ENGINES_KEPT = 32


def _engine(conn_string: str) -> Engine:
    return create_engine(
        conn_string, poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
    )


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
        """The shard's engine, made on first use; the least recently used one dropped past
        ENGINES_KEPT (NullPool: it holds no connection)."""
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
