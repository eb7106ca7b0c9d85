"""One DuckDB instance per warehouse while a command holds its writer lock (warehouse/kept.py):
steps share it, writers still checkpoint, and no write ever lands in a file renamed over.
Real DuckDB files; a real fork."""

from __future__ import annotations

import os
import shutil

import duckdb
import pytest

from tests.test_warehouse_vacuum import churned, free_share
from warehouse import kept
from warehouse.load import Warehouse
from warehouse.publish import publish, working_copy
from warehouse.writer import writing

DEFAULT_THREADS = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]


def threads(wh: Warehouse) -> int:
    """A setting of the instance (global), not of the connection: which instance it is."""
    return wh.con.execute("SELECT current_setting('threads')").fetchone()[0]


def rows(path, table: str = "t") -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_commands_steps_share_one_instance_and_each_writer_checkpoints(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    with writing(work):
        with Warehouse(work) as wh:
            wh.con.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
            wh.con.execute("SET threads = 1")
        assert not work.with_name(work.name + ".wal").exists()  # checkpointed as it closed
        with Warehouse(work) as wh:
            assert threads(wh) == 1  # the same instance
            assert wh.con.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",)
        with Warehouse(work, read_only=True) as reader:  # a reader in the command: a cursor too
            assert threads(reader) == 1
    assert rows(work) == 10  # the hold has ended: the instance closed, the file whole
    with Warehouse(work) as wh:
        assert threads(wh) == DEFAULT_THREADS  # outside a hold: a Warehouse's own instance


def test_without_a_hold_every_warehouse_opens_its_own(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    with Warehouse(work) as wh:
        wh.con.execute("SET threads = 1")
    with Warehouse(work) as wh:
        assert threads(wh) == DEFAULT_THREADS


def test_a_write_after_a_compaction_in_the_same_command_lands_in_the_new_file(tmp_path):
    """The publication writes the working copy anew and renames it over the old one; a step
    after it in the same command (the run's record) must write the new file, not the old
    inode the instance had open."""
    published = tmp_path / "warehouse.duckdb"
    work = churned(published)
    with writing(work):
        with Warehouse(work) as wh:
            wh.con.execute("CREATE TABLE t (x INTEGER)")
        publish(work, published)
        assert free_share(work) == 0.0  # it was written anew
        with Warehouse(work) as wh:
            wh.con.execute("INSERT INTO t VALUES (1)")
    assert rows(work) == 1
    assert rows(work, "ops.scratch") == 200_000


def test_a_file_replaced_while_idle_is_opened_anew(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    with writing(work):
        with Warehouse(work) as wh:
            wh.con.execute("CREATE TABLE t (x INTEGER)")
        os.replace(shutil.copy(other, tmp_path / "copy.duckdb"), work)  # nobody said replaced
        with Warehouse(work) as wh:  # the inode tells: not the instance's file
            wh.con.execute("INSERT INTO t VALUES (2)")
    assert rows(work) == 2


def test_a_file_replaced_while_in_use_is_refused(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    with writing(work), Warehouse(work) as wh:
        wh.con.execute("CREATE TABLE t (x INTEGER)")
        kept.replaced(work)
        with pytest.raises(RuntimeError, match="replaced while this process still reads it"):
            Warehouse(work).open()


def test_a_failed_step_lets_the_instance_go(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    with writing(work):
        with pytest.raises(duckdb.CatalogException), Warehouse(work) as wh:
            wh.con.execute("SET threads = 1")
            wh.con.execute("SELECT * FROM no_such_table")
        with Warehouse(work) as wh:
            assert threads(wh) == DEFAULT_THREADS  # a fresh instance


def test_a_forked_process_does_not_use_its_parents_instance(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    with writing(work), Warehouse(work) as wh:
        wh.con.execute("CREATE TABLE t (x INTEGER)")
        pid = os.fork()
        if pid == 0:  # the child: nothing kept, and it must not close the parent's instance
            os._exit(0 if not kept._instances else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        wh.con.execute("INSERT INTO t VALUES (3)")  # the parent's instance still works
    assert rows(work) == 1


def test_a_warehouse_left_open_past_its_hold_leaves_the_next_holds_instance_alone(tmp_path):
    """A cursor closed after its hold ended counts against its own instance, never against
    the next hold's: the next hold's writer still checkpoints as it closes."""
    work = working_copy(tmp_path / "warehouse.duckdb")
    with writing(work):
        with Warehouse(work) as wh:
            wh.con.execute("CREATE TABLE t (x INTEGER)")
        reader = Warehouse(work, read_only=True)
        reader.open()
    with writing(work):
        wh = Warehouse(work)
        wh.open()  # the next hold's instance
        reader.close()  # the first hold's cursor, done at last
        wh.con.execute("INSERT INTO t VALUES (4)")
        wh.close()
        assert not work.with_name(work.name + ".wal").exists()  # it was the only one: checkpointed
    assert rows(work) == 1
