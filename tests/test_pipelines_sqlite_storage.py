"""The instance's SQLite storage on one machine (pipelines/sqlite_storage.py): Dagster's files
and layout, one SQLAlchemy engine per file keeping a connection. Real instances in temporary
homes, real runs, a real fork."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest
import yaml
from dagster import (
    AssetCheckResult,
    AssetKey,
    DagsterInstance,
    asset,
    asset_check,
    materialize,
)
from sqlalchemy import event

from pipelines import home, sqlite_storage

pytestmark = pytest.mark.usefixtures("no_postgres")


@pytest.fixture
def no_postgres(monkeypatch):
    monkeypatch.delenv("DAGSTER_POSTGRES_URL", raising=False)
    monkeypatch.delenv("CLINICAL_TENANTS_FILE", raising=False)


@asset
def numbers() -> list[int]:
    return [1, 2, 3]


@asset_check(asset=numbers)
def three_numbers(numbers: list[int]) -> AssetCheckResult:
    return AssetCheckResult(passed=len(numbers) == 3)


def materialize_twice(instance: DagsterInstance) -> list[str]:
    runs = [materialize([numbers, three_numbers], instance=instance) for _ in range(2)]
    assert all(run.success for run in runs)
    return [run.run_id for run in runs]


def test_a_home_reads_and_writes_through_one_engine_per_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    made: list[str] = []
    opened: list[str] = []
    original = sqlite_storage._engine

    def counted(conn_string: str):
        made.append(conn_string)
        engine = original(conn_string)
        event.listen(engine, "connect", lambda *_: opened.append(conn_string))
        return engine

    monkeypatch.setattr(sqlite_storage, "_engine", counted)
    with home.prepare_instance() as instance:
        assert isinstance(instance.event_log_storage, sqlite_storage.SqliteEventLogStorage)
        assert isinstance(instance.run_storage, sqlite_storage.SqliteRunStorage)
        assert isinstance(instance.schedule_storage, sqlite_storage.SqliteScheduleStorage)
        first, second = materialize_twice(instance)
        # every event of both runs is kept and read back, in Dagster's own files
        for run_id in (first, second):
            kinds = {
                e.dagster_event_type.value for e in instance.all_logs(run_id) if e.is_dagster_event
            }
            assert {"ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION", "PIPELINE_SUCCESS"} <= kinds
            assert (tmp_path / "home" / "history" / "runs" / f"{run_id}.db").exists()
        record = instance.get_latest_materialization_event(AssetKey("numbers"))
        assert record is not None and record.run_id == second
        check = instance.event_log_storage.get_asset_check_execution_history(
            three_numbers.check_key, limit=5
        )
        assert [c.run_id for c in check] == [second, first]
    # hundreds of uses, one engine per file: runs, schedules, index and each run's own
    assert len(made) == len(set(made)) <= 5, made
    # and a connection kept by each (Dagster opens a new one per use: hundreds here)
    assert len(opened) <= 3 * len(made), opened


def test_history_written_by_dagsters_default_storage_is_read_as_it_was(tmp_path, monkeypatch):
    """A home made before this storage (Dagster's default SQLite) keeps its runs."""
    root = tmp_path / "home"
    root.mkdir()
    with DagsterInstance.from_config(str(root)) as before:  # no dagster.yaml: Dagster's own
        assert not isinstance(before.event_log_storage, sqlite_storage.SqliteEventLogStorage)
        old_runs = materialize_twice(before)
    monkeypatch.setenv("DAGSTER_HOME", str(root))
    with home.prepare_instance() as instance:
        assert isinstance(instance.event_log_storage, sqlite_storage.SqliteEventLogStorage)
        assert {r.run_id for r in instance.get_runs()} == set(old_runs)
        assert instance.all_logs(old_runs[0])
        new_run = materialize_twice(instance)[0]
        record = instance.get_latest_materialization_event(AssetKey("numbers"))
        assert record is not None and record.run_id != old_runs[1]
    with DagsterInstance.from_config(str(root)) as again:  # and back: the same files
        assert new_run in {r.run_id for r in again.get_runs()}


def test_the_storage_block_is_the_homes_own_and_postgres_replaces_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    written = yaml.safe_load((home.dagster_home() / "dagster.yaml").read_text())
    assert written["storage"]["custom"]["config"] == {"base_dir": str(tmp_path / "home")}
    assert written["concurrency"]["pools"]["default_limit"] == 1  # the repository's file too
    assert "storage" not in yaml.safe_load(home.INSTANCE_YAML.read_text())
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", "postgresql://u:p@db:5432/dagster")
    on_postgres = yaml.safe_load(home.instance_settings(tmp_path / "home"))
    assert on_postgres["storage"] == {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}


def test_an_opened_instance_starts_no_thread_for_a_forked_child_to_inherit(tmp_path, monkeypatch):
    """`sync --all-tenants` forks with the instance open (`home.inherited`): nothing in it
    may run on a thread."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    before = threading.active_count()
    with home.prepare_instance() as instance:
        materialize_twice(instance)
        assert threading.active_count() == before
        with home.inherited(instance), home.instance(prepared=True) as child_sees:
            assert child_sees is instance
        with home.instance(prepared=True) as opened_again:
            assert opened_again is not instance


def test_a_forked_child_never_uses_a_connection_its_parent_opened(tmp_path, monkeypatch):
    """The parent closes the connections it keeps before it forks; the child starts with
    empty pools and runs on its own connections; the parent opens its own again and works
    after the child has written the same files and ended."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    seen: dict[int, int] = {}  # connection id -> the process that opened it
    original = sqlite3.dbapi2.connect  # what SQLAlchemy's pysqlite dialect calls

    def recorded(*args, **kwargs):
        conn = original(*args, **kwargs)
        seen[id(conn)] = os.getpid()
        return conn

    monkeypatch.setattr(sqlite3.dbapi2, "connect", recorded)
    with home.prepare_instance() as instance:
        materialize_twice(instance)  # the parent's connections, kept in the pools
        engines = list(instance.event_log_storage._engines.values())
        assert engines and all(e.pool.checkedin() for e in engines)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it found, run, and leave without cleanup
            ok = "0"
            try:
                empty = all(e.pool.checkedin() == 0 for e in engines)
                used: list[int] = []
                for e in engines:
                    event.listen(e, "checkout", lambda dbapi, *_: used.append(id(dbapi)))
                runs = materialize_twice(instance)
                mine = bool(used) and all(seen.get(c) == os.getpid() for c in used)
                ok = f"{int(empty)}{int(mine)}{len(runs)}"
            finally:
                os.write(write, ok.encode())
                os._exit(0)
        os.close(write)
        assert all(e.pool.checkedin() == 0 for e in engines)  # closed before the fork
        _, status = os.waitpid(pid, 0)
        # its pools were empty, every connection it used its own, both runs done
        assert os.read(read, 8) == b"112" and os.waitstatus_to_exitcode(status) == 0
        assert len(instance.get_runs()) == 4  # the parent reads the child's runs
        materialize_twice(instance)  # and writes on its own connections still


def test_the_webserver_keeps_a_bounded_number_of_engines(tmp_path):
    storage = sqlite_storage.SqliteEventLogStorage(str(Path(tmp_path) / "runs"))
    for n in range(sqlite_storage.ENGINES_KEPT + 10):
        with storage.run_connection(f"run-{n}") as conn:
            assert conn is not None
    assert len(storage._engines) == sqlite_storage.ENGINES_KEPT


def test_each_storages_class_data_rehydrates_to_ours_in_the_same_folder(tmp_path):
    """What Dagster hands a process it starts (a path with a quote in it, as a home may have)."""
    from dagster._core.storage.event_log.base import EventLogStorage
    from dagster._core.storage.runs.base import RunStorage
    from dagster._core.storage.schedules.base import ScheduleStorage

    root = tmp_path / "clinic's home"
    storage = sqlite_storage.SqliteStorage.from_local(str(root))
    events = storage.event_storage_data.rehydrate(as_type=EventLogStorage)
    runs = storage.run_storage_data.rehydrate(as_type=RunStorage)
    schedules = storage.schedule_storage_data.rehydrate(as_type=ScheduleStorage)
    assert isinstance(events, sqlite_storage.SqliteEventLogStorage)
    assert isinstance(runs, sqlite_storage.SqliteRunStorage)
    assert isinstance(schedules, sqlite_storage.SqliteScheduleStorage)
    assert Path(events._base_dir) == root / "history" / "runs"
    assert sorted(p.name for p in root.rglob("*.db")) == ["index.db", "runs.db", "schedules.db"]
