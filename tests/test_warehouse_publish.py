"""The published warehouse: a working copy published atomically, private files, honest locks,
and `clinical-sync sql` on what was published. Real DuckDB files and real processes."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from cli.main import main
from pipelines.runner import sync
from warehouse.load import Warehouse, WarehouseLocked
from warehouse.private import private_dir, tighten_tree
from warehouse.publish import publish, working_copy, working_path

READER = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print(con.execute("SELECT count(*) FROM t").fetchone()[0], flush=True)
sys.stdin.readline()  # hold the connection until told
print(con.execute("SELECT count(*) FROM t").fetchone()[0], flush=True)
"""


def count(path: Path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM t").fetchone()[0]


def write(work: Path, rows: int) -> None:
    with Warehouse(work) as wh:
        wh.con.execute("CREATE OR REPLACE TABLE t AS SELECT range AS x FROM range(?)", [rows])
        wh.con.execute("COMMENT ON TABLE t IS 'kept in the copy'")
        wh.con.execute("CREATE OR REPLACE VIEW v AS SELECT x FROM t")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_working_copy_lives_beside_the_published_file(tmp_path):
    assert working_path(tmp_path / "data" / "warehouse.duckdb") == (
        tmp_path / "data" / "warehouse.work" / "warehouse.duckdb"
    )


@contextmanager
def holding(path: Path) -> Iterator[subprocess.Popen]:
    """Another process with a connection open on `path` (READER), killed at the end."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(READER), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()


def test_publish_is_atomic_for_readers_and_private(tmp_path):
    published = tmp_path / "warehouse.duckdb"
    work = working_copy(published)
    write(work, 3)
    first = publish(work, published)
    assert first.bytes == published.stat().st_size and count(published) == 3
    with holding(published) as reader:
        assert reader.stdout.readline().strip() == "3"
        write(work, 5)  # the reader holds the published file: the working copy is free
        publish(work, published)  # and publishing does not wait for the reader either
        assert count(published) == 5  # a new connection sees the new night
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "3"  # the held one keeps its own
    with duckdb.connect(str(published), read_only=True) as con:
        (comment,) = con.execute(
            "SELECT comment FROM duckdb_tables() WHERE table_name = 't'"
        ).fetchone()
        assert comment == "kept in the copy"
        assert con.execute("SELECT count(*) FROM v").fetchone() == (5,)
    assert mode(published) == 0o600 and mode(work) == 0o600 and mode(work.parent) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warehouse.duckdb", "warehouse.work"]


OLD_SYNC = """
import os, sys
from warehouse.load import Warehouse
wh = Warehouse(sys.argv[1])
wh.open()
wh.ensure_schema()
wh.con.execute("INSERT INTO ops.sync_state (entity, watermark) VALUES ('Claims', '2026-11-01')")
os._exit(0)  # gone before it closed: the last commit is in the write-ahead log alone
"""


def test_an_old_single_file_warehouse_is_adopted_with_its_state(tmp_path):
    published = tmp_path / "warehouse.duckdb"  # as the sync wrote it before the working copy
    subprocess.run([sys.executable, "-c", textwrap.dedent(OLD_SYNC), str(published)], check=True)
    assert Path(f"{published}.wal").exists()
    os.chmod(published, 0o644)  # the umask of the old days
    work = working_copy(published)
    assert work.exists() and mode(published) == 0o600 and mode(work) == 0o600
    with Warehouse(work, read_only=True) as wh:
        assert wh.watermark("Claims") == "2026-11-01"
    write(work, 7)
    assert working_copy(published) == work and count(work) == 7  # adopted once, never again


@pytest.mark.integration
def test_the_first_sync_after_the_upgrade_keeps_state_and_runs(fresh_sandbox, tmp_path):
    env = {
        **fresh_sandbox.env(),
        "CLINICAL_RATE_LIMIT": "1000",
        "CLINICAL_BURST": "200",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "limiter.sqlite"),
    }
    published = tmp_path / "warehouse.duckdb"
    paths = {"lake_root": str(tmp_path / "lake"), "warehouse_path": str(published)}
    assert sync(env, **paths, only=["Claims"], log_level="ERROR").success
    # A warehouse from before the working copy: one file at WAREHOUSE_PATH, nothing beside it.
    os.replace(working_path(published), published)
    shutil.rmtree(working_path(published).parent)
    fresh_sandbox.control().advance(seconds=86400, insert_fraction=0.05)
    report = sync(env, **paths, only=["Claims"], log_level="ERROR")
    assert report.success and report.entities["Claims"]["mode"] == "incremental"
    with duckdb.connect(str(published), read_only=True) as con:
        runs = con.execute('SELECT "status" FROM "ops"."sync_runs"').fetchall()
    assert runs == [("success",), ("success",)]


def test_a_held_working_copy_names_its_holder_and_what_to_do(tmp_path):
    work = working_copy(tmp_path / "warehouse.duckdb")
    write(work, 1)
    with holding(work) as holder:
        assert holder.stdout.readline().strip() == "1"
        with pytest.raises(WarehouseLocked) as err:
            Warehouse(work, wait=0.3).open()
        message = str(err.value)
        assert f"held by process {holder.pid} (python" in message and "0.3 s" in message
        assert "open the published WAREHOUSE_PATH read-only" in message


def test_open_files_from_before_are_tightened_once_with_a_log_line(tmp_path, caplog):
    lake = tmp_path / "lake"
    (lake / "entity=claims").mkdir(parents=True)
    (lake / "entity=claims" / "a.parquet").write_bytes(b"x")
    for path in (lake, lake / "entity=claims"):
        path.chmod(0o755)
    (lake / "entity=claims" / "a.parquet").chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert tighten_tree(lake, f"lake {lake}") == 3
        assert tighten_tree(lake, f"lake {lake}") == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"lake {lake}: 3 files and folders were open to other accounts; now owner-only (0600/0700)"
    ]
    assert mode(lake / "entity=claims" / "a.parquet") == 0o600


def test_private_dir_ignores_the_umask(tmp_path):
    old = os.umask(0)
    try:
        made = private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert mode(made) == mode(made.parent) == 0o700


# -- clinical-sync sql -------------------------------------------------------------------------


@pytest.fixture
def published(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "warehouse.duckdb"
    monkeypatch.setenv("WAREHOUSE_PATH", str(path))
    work = working_copy(path)
    with Warehouse(work) as wh:
        wh.con.execute("CREATE SCHEMA clinical")
        wh.con.execute(
            "CREATE TABLE clinical.claims AS SELECT * FROM (VALUES "
            "(1, 'open', 12.5::DECIMAL(18,4)), (22, NULL, 7::DECIMAL(18,4))) AS c(id, state, amount)"
        )
    publish(work, path)
    return path


def test_sql_prints_a_table(published, capsys):
    assert main(["sql", "-c", "SELECT * FROM clinical.claims ORDER BY id"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [  # a decimal without its scale's zeros (cli/cells.py)
        "id  state  amount",
        "--  -----  ------",
        " 1  open     12.5",
        "22  NULL        7",
        "(2 rows)",
    ]


def test_sql_errors_are_one_line_and_writes_are_refused(published, capsys):
    assert main(["sql", "-c", "SELECT nope FROM clinical.claims"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clinical-sync sql: Binder Error")
    assert main(["sql", "-c", "DELETE FROM clinical.claims"]) == 1
    assert "read-only" in capsys.readouterr().err


def test_sql_reads_statements_from_stdin(published):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "sql"],
        input="SELECT count(*) AS n FROM clinical.claims;\nSELECT 'a;b' AS s;\n",
        capture_output=True,
        text=True,
        env={**os.environ, "WAREHOUSE_PATH": str(published)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["n", "-", "2", "(1", "row)", "s", "---", "a;b", "(1", "row)"]


def test_sql_without_a_warehouse_says_how_to_make_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WAREHOUSE_PATH", str(tmp_path / "none.duckdb"))
    assert main(["sql", "-c", "SELECT 1"]) == 1
    assert "clinical-sync sync" in capsys.readouterr().err
