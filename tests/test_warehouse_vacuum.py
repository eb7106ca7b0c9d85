"""The night's checkpoints never vacuum: dead rows stay until a clinical table's (or the
models' tables' together) are a fifth of what it stores, or free blocks a fifth of the file;
then the publication writes the file compactly, the one place dead space goes."""

from __future__ import annotations

import stat
from pathlib import Path

import duckdb
import pytest

from connectors.clinical_records.catalogue import CLAIMS, PRESCRIPTIONS
from tests.warehouse_records import Harness, record
from warehouse import dbt_project, models, vacuum
from warehouse import publish as publish_module
from warehouse.load import Warehouse
from warehouse.publish import publish, working_copy

ROWS = 2_000


def stored_and_live(h: Harness) -> tuple[int, int]:
    """Rows the table stores (deleted ones included) and rows it holds, read after reopening,
    so that the checkpoint of closing has run."""
    h.close()
    h.wh.open()
    return vacuum.stored_and_live(h.wh.con, "clinical")[CLAIMS.table]


def replace_every(h: Harness, step: int, amount: str, day: int) -> None:
    changed = [record(CLAIMS, i, total_claim_amount=amount) for i in range(0, ROWS, step)]
    assert h.sync(CLAIMS, changed, day=day).updated == len(changed)


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path, entities=[CLAIMS])
    h.sync(CLAIMS, [record(CLAIMS, i) for i in range(ROWS)])
    yield h
    h.close()


def tasks(h: Harness) -> int:
    return int(h.rows(f"SELECT current_setting('{vacuum.SETTING}')")[0][0])


DUCKDB_DEFAULT = int(
    duckdb.connect().execute(f"SELECT current_setting('{vacuum.SETTING}')").fetchone()[0]
)


def stored_and_live_at(path: Path) -> tuple[int, int]:
    with duckdb.connect(str(path), read_only=True) as con:
        return vacuum.stored_and_live(con, "clinical")[CLAIMS.table]


def test_dead_rows_stay_until_a_fifth_of_the_table_then_the_publication_compacts(harness, tmp_path):
    """Before, the load that crossed the line let the checkpoint vacuum every table, and the
    publication then wrote the file anew as well: the same rows rewritten twice in a night."""
    published = tmp_path / "published.duckdb"
    replace_every(harness, 10, "7", day=1)  # 200 dead of 2,200 stored: 9%
    assert tasks(harness) == 0
    assert stored_and_live(harness) == (ROWS + ROWS // 10, ROWS)
    harness.close()
    publish(harness.path, published)  # not due: the file as it is
    assert (
        stored_and_live_at(harness.path)
        == stored_and_live_at(published)
        == (ROWS + ROWS // 10, ROWS)
    )

    harness.wh.open()
    replace_every(harness, 4, "8", day=2)  # 200 + 500 dead of 2,700: 26%
    assert stored_and_live(harness) == (ROWS + ROWS // 10 + ROWS // 4, ROWS)  # no vacuum
    harness.close()
    publish(harness.path, published)
    assert stored_and_live_at(harness.path) == stored_and_live_at(published) == (ROWS, ROWS)
    harness.wh.open()
    amounts = dict(
        harness.rows('SELECT "id", "total_claim_amount"::DOUBLE FROM "clinical"."claims"')
    )
    assert amounts[0] == amounts[4] == 8 and amounts[10] == 7
    assert amounts[1] == 1.5


def test_a_duckdb_without_the_setting_keeps_its_own_vacuum(tmp_path, monkeypatch):
    monkeypatch.setattr(vacuum, "SETTING", "a_setting_this_duckdb_lacks")
    h = Harness(tmp_path, entities=[CLAIMS])
    h.sync(CLAIMS, [record(CLAIMS, i) for i in range(ROWS)])
    replace_every(h, 10, "7", day=1)
    assert int(h.rows("SELECT current_setting('max_vacuum_tasks')")[0][0]) == DUCKDB_DEFAULT
    h.close()


@pytest.mark.parametrize(
    ("stored", "live", "due"),
    [(0, 0, False), (1000, 1000, False), (1000, 801, False), (1000, 800, True), (10, 0, True)],
)
def test_the_vacuum_is_due_at_a_fifth_of_the_stored_rows(stored, live, due):
    assert vacuum.is_due(stored, live) is due


def churned(published) -> Path:
    """A working copy a third of which is free blocks, and its analytics built."""
    work = working_copy(published)
    models.build(work)
    with Warehouse(work) as wh:
        wh.con.execute("CREATE TABLE ops.gone AS SELECT md5(range::TEXT) FROM range(500000)")
        wh.con.execute("CHECKPOINT")
        wh.con.execute(
            "CREATE TABLE ops.scratch AS SELECT range AS n, md5(range::TEXT) AS t "
            "FROM range(300000)"
        )
        wh.con.execute("CHECKPOINT")
        wh.con.execute("DELETE FROM ops.scratch WHERE n % 3 = 0")
        wh.con.execute("DROP TABLE ops.gone")  # its blocks before the scratch's: free, kept
        wh.con.execute("CHECKPOINT")
        assert vacuum.file_is_due(wh.con)
    return work


def free_share(path) -> float:
    with duckdb.connect(str(path), read_only=True) as con:
        return vacuum.free_share(con)


def test_a_fifth_of_free_blocks_is_written_compactly_at_publication(tmp_path):
    """Free blocks past a fifth of the file: the publication writes the working copy anew,
    with every table, row and comment, and publishes that; below the line, a byte copy."""
    published = tmp_path / "warehouse.duckdb"
    work = churned(published)
    with Warehouse(work, read_only=True) as wh:
        comments = wh.con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE comment IS NOT NULL"
        ).fetchone()
    size = work.stat().st_size
    publish(work, published)
    assert free_share(work) == free_share(published) == 0.0
    assert work.stat().st_size < size / 2
    with duckdb.connect(str(published), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ops.scratch").fetchone() == (200_000,)
        assert (
            con.execute(
                "SELECT count(*) FROM duckdb_columns() WHERE comment IS NOT NULL"
            ).fetchone()
            == comments
        )
    assert stat.S_IMODE(work.stat().st_mode) == stat.S_IMODE(published.stat().st_mode) == 0o600
    assert not list(work.parent.glob("*.compacting"))
    with Warehouse(work) as wh:  # the compact working copy is the warehouse from now on
        wh.ensure_schema()
        found = models.models(dbt_project.manifest_json(dbt_project.prepare()))
        assert models.stale(wh.con, found) == []
        assert wh.con.execute(  # the history macros came along with the tables
            'SELECT count(*) FROM "history"."claims_as_of"(now())'
        ).fetchone() == (0,)
    size = work.stat().st_size
    publish(work, published)  # nothing due: the same file, copied
    assert work.stat().st_size == size


def test_a_compaction_that_fails_still_publishes_the_night(tmp_path, monkeypatch, caplog):
    """Writing the file anew needs room for a second copy; without it (here: DuckDB's error
    from a full disk) the night is published as it is, with a warning, and nothing is lost."""
    published = tmp_path / "warehouse.duckdb"
    work = churned(published)

    def full_disk(wh, work):
        raise duckdb.IOException("could not write file: No space left on device")

    monkeypatch.setattr(publish_module, "_compact", full_disk)
    publish(work, published)
    assert free_share(published) > 0.2  # published as it was
    with duckdb.connect(str(published), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ops.scratch").fetchone() == (200_000,)
    assert "not written compactly: could not write file" in caplog.text


def test_an_incremental_models_dead_rows_stay_until_the_publication_compacts(tmp_path):
    """A night's incremental build deletes the rows of the claims that changed and inserts
    them again; they stay until the models' tables' dead rows together are a fifth of what
    they store, then the publication writes the file compactly. (Claims without a
    prescription keep the clinical table's own dead rows under a fifth: the models' rule is
    the one that decides here.)"""
    h = Harness(tmp_path)
    h.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, 1, patient_id=1)])
    unlinked = {"prescription_id": None, "billing_branch_id": None}
    linked = {"prescription_id": 1, "billing_branch_id": None}
    claims = [record(CLAIMS, i, **linked) for i in range(ROWS)]
    claims += [record(CLAIMS, i, **unlinked) for i in range(ROWS, 5 * ROWS)]
    h.sync(CLAIMS, claims)
    h.close()
    assert models.build(h.path).ok

    def claims_change(step: int, amount: str, day: int) -> None:
        h.wh.open()
        changed = [
            record(CLAIMS, i, **linked, total_claim_amount=amount) for i in range(0, ROWS, step)
        ]
        assert h.sync(CLAIMS, changed, day=day).updated == len(changed)
        h.close()
        assert models.build(h.path).ok

    def stored_and_live_model() -> tuple[int, int]:
        with Warehouse(h.path, read_only=True) as wh:
            return vacuum.stored_and_live(wh.con, "analytics")["prescription_claims"]

    published = tmp_path / "published.duckdb"
    claims_change(10, "7", day=1)  # 200 rows of 2,000 built again: 9% dead
    assert stored_and_live_model() == (ROWS + ROWS // 10, ROWS)
    publish(h.path, published)
    assert stored_and_live_model() == (ROWS + ROWS // 10, ROWS)  # not due
    # 1,000 more, the 200 of day 1 among them: their row group, empty, is dropped (DuckDB
    # drops an empty row group at a checkpoint even with the vacuum held); no other vacuum
    claims_change(2, "8", day=2)
    assert stored_and_live_model() == (ROWS + ROWS // 2, ROWS)  # 1,000 dead of 3,000
    publish(h.path, published)
    assert stored_and_live_model() == (ROWS, ROWS)
    with duckdb.connect(str(published), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM analytics.prescription_claims").fetchone() == (
            ROWS,
        )
