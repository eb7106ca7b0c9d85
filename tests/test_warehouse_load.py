"""Merging lake batches into DuckDB: idempotence, history, soft deletes, locks and guards."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    CLAIMS,
    PATIENTS,
    Canonical,
    EntitySet,
    Field,
    Strategy,
    f,
)
from tests.warehouse_records import Harness, record
from warehouse.lake import Lake
from warehouse.load import SourceMismatch, Warehouse, WarehouseLocked, status

EVERYTHING = """
    SELECT * EXCLUDE ("_extras"), "_extras"::VARCHAR FROM "clinical"."{t}" ORDER BY ALL
"""


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close()


def amounts(harness: Harness) -> dict[int, Decimal]:
    return dict(harness.rows('SELECT "id", "total_claim_amount" FROM "clinical"."claims"'))


def test_loading_the_same_batch_twice_changes_nothing(harness):
    path = harness.write(CLAIMS, [record(CLAIMS, i) for i in range(1, 6)] + [{"id": "bad"}])
    first = harness.wh.load(CLAIMS, [path], run_id="r1", snapshot=True, watermark="2026-02-01")
    tables = {
        name: harness.rows(f"SELECT * FROM {name} ORDER BY ALL")
        for name in ('"clinical"."claims"', '"history"."claims"', '"ops"."rejects"')
    }
    second = harness.wh.load(CLAIMS, [path], run_id="r1", snapshot=True, watermark="2026-02-01")
    assert (first.inserted, first.rejected) == (5, 1)
    assert (second.inserted, second.updated, second.unchanged, second.soft_deleted) == (0, 0, 5, 0)
    for name, rows in tables.items():
        assert harness.rows(f"SELECT * FROM {name} ORDER BY ALL") == rows, name
    assert harness.rows('SELECT count(*) FROM "ops"."loaded_batches"') == [(1,)]


def test_a_changed_record_gets_a_new_history_version_and_same_content_does_not(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1, total_claim_amount="10.00")], day=0)
    result = harness.sync(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="12.50", updated_at="2026-02-02")], day=1
    )
    assert (result.updated, result.inserted) == (1, 0)
    again = harness.sync(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="12.50", updated_at="2026-02-02")], day=2
    )
    assert (again.updated, again.unchanged) == (0, 1)
    versions = harness.rows(
        'SELECT "total_claim_amount", "_valid_from" < "_valid_to", "_valid_to" IS NULL '
        'FROM "history"."claims" WHERE "id" = 1 ORDER BY "_valid_from"'
    )
    assert versions == [(Decimal("10.00"), True, False), (Decimal("12.50"), None, True)]
    assert amounts(harness) == {1: Decimal("12.50")}


def test_newest_wins_by_cursor_then_extraction_time(harness):
    newer = harness.write(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="2", updated_at="2026-02-05")], day=0
    )
    older = harness.write(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="1", updated_at="2026-02-01")], day=1
    )
    result = harness.wh.load(CLAIMS, [older, newer], run_id="r", snapshot=False)
    assert result.inserted == 1 and amounts(harness) == {1: Decimal("2")}
    # A later load of the older version is stale: nothing changes.
    stale = harness.wh.load(CLAIMS, [older], run_id="r", snapshot=False)
    assert (stale.updated, stale.unchanged) == (0, 1)
    assert amounts(harness) == {1: Decimal("2")}
    # Same cursor: the later extraction wins.
    harness.sync(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="3", updated_at="2026-02-05")], day=2
    )
    assert amounts(harness) == {1: Decimal("3")}


def test_snapshot_soft_deletes_what_it_misses_and_resurrects_what_returns(harness):
    harness.sync(CLAIMS, [record(CLAIMS, i) for i in (1, 2, 3)], day=0, snapshot=True)
    gone = harness.sync(CLAIMS, [record(CLAIMS, i) for i in (1, 3)], day=1, snapshot=True)
    assert (gone.soft_deleted, gone.unchanged) == (1, 2)
    deleted = harness.rows('SELECT "id" FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL')
    assert deleted == [(2,)]
    assert harness.rows(
        'SELECT count(*) FROM "history"."claims" WHERE "id" = 2 AND "_valid_to" IS NULL'
    ) == [(0,)]
    # An incremental load does not delete anything.
    assert harness.sync(CLAIMS, [record(CLAIMS, 1)], day=2).soft_deleted == 0
    back = harness.sync(CLAIMS, [record(CLAIMS, i) for i in (1, 2, 3)], day=3, snapshot=True)
    assert (back.resurrected, back.soft_deleted) == (1, 0)
    assert harness.rows(
        'SELECT count(*) FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL'
    ) == [(0,)]
    assert harness.rows('SELECT count(*) FROM "history"."claims" WHERE "id" = 2') == [(2,)]


def test_a_rejected_record_in_a_snapshot_is_not_marked_deleted(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], snapshot=True)
    result = harness.sync(
        CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2, date_of_service="soon")], snapshot=True
    )
    assert (result.rejected, result.soft_deleted) == (1, 0)


def test_watermark_is_written_with_the_rows_and_a_failed_load_rolls_back(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1)])
    assert harness.wh.watermark("Claims") == "w1"
    path = harness.write(CLAIMS, [record(CLAIMS, 2), record(CLAIMS, 3, id="x")])
    rejects = (
        Lake.root_of(path) / "_rejects" / "entity=claims" / f"{Lake.info(path).batch_id}.parquet"
    )
    rejects.unlink()  # the load fails after staging the rows
    with pytest.raises(Exception, match="parquet"):
        harness.wh.load(CLAIMS, [path], run_id="r9", watermark="w-new")
    assert harness.wh.watermark("claims") == "w1"
    assert amounts(harness) == {1: Decimal("1.5")}


HOSTILE = 'x"; drop table clinical.patients; --'


def test_hostile_identifiers_are_stored_not_executed(tmp_path):
    hostile = EntitySet(
        name="Hostile",
        type_name="Hostile",
        table=HOSTILE,
        strategy=Strategy.SNAPSHOT,
        fields=(
            f("id", CLAIMS.field("id").type, "Unique identifier (required)", key="claim"),
            Field(HOSTILE, CLAIMS.field("additional_info").type, None, "it's a 'quoted' meaning"),
        ),
    )
    harness = Harness(tmp_path, entities=[PATIENTS, hostile])
    try:
        harness.sync(hostile, [{"id": 1, HOSTILE: "kept"}])
        harness.sync(PATIENTS, [record(PATIENTS, 5, **{HOSTILE: "also kept"})])
        tables = {t for (t,) in harness.rows("SELECT table_name FROM duckdb_tables()")}
        assert {"patients", HOSTILE} <= tables
        column = f'"{HOSTILE.replace(chr(34), chr(34) * 2)}"'
        assert harness.rows(f'SELECT {column} FROM "clinical".{column}') == [("kept",)]
        assert harness.rows(
            f"""SELECT "_extras"->>'{HOSTILE.replace("'", "''")}' FROM "clinical"."patients" """
        ) == [("also kept",)]
    finally:
        harness.close()


HOLDER = """
import sys, time
from warehouse.load import Warehouse
with Warehouse(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_locked_warehouse_gives_a_clear_error(tmp_path):
    path = tmp_path / "locked.duckdb"
    with Warehouse(path) as wh:
        wh.ensure_schema()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(path), "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(WarehouseLocked, match="locked by another process") as err:
            Warehouse(path).open()
        assert str(path) in str(err.value)
        with pytest.raises(WarehouseLocked):
            status(path)
        with Warehouse(path, wait=30) as wh:  # waits for the holder to finish
            assert wh.watermark("Claims") is None
    finally:
        holder.kill()
        holder.wait()


def test_source_guard_refuses_another_source(harness):
    harness.wh.check_source("https://a.example/api", "acme")
    harness.wh.check_source("https://a.example/api", "acme")
    with pytest.raises(SourceMismatch, match="another source"):
        harness.wh.check_source("https://b.example/api", "other")
    harness.wh.check_source("https://b.example/api", "other", force=True)
    assert harness.rows('SELECT "customer" FROM "ops"."source"') == [("other",)]
    harness.lake.record_source("https://a.example/api", "acme")
    with pytest.raises(SourceMismatch, match="LAKE_ROOT"):
        harness.lake.record_source("https://b.example/api", "other")


def test_status_reports_rows_rejects_and_watermark(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2, id="z")])
    harness.close()
    claims = {s.entity: s for s in status(harness.path)}["Claims"]
    assert (claims.rows, claims.rejects, claims.watermark, claims.last_run_id) == (
        1,
        1,
        "w1",
        "run-001",
    )


def test_runs_are_recorded(harness):
    harness.wh.record_run("r1", ["Claims"], full_snapshot=True)
    result = harness.sync(CLAIMS, [record(CLAIMS, 1)])
    harness.wh.finish_run("r1", "success", {"Claims": result})
    assert harness.rows(
        'SELECT "status", "inserted", "finished_at" >= "started_at" FROM "ops"."sync_runs"'
    ) == [("success", 1, True)]


def test_canonical_types_of_the_catalogue_are_the_table_types(harness):
    types = dict(
        harness.rows(
            "SELECT column_name, data_type FROM duckdb_columns() "
            "WHERE schema_name = 'clinical' AND table_name = 'claims'"
        )
    )
    for fld in CLAIMS.fields:
        assert types[fld.name] == fld.canonical.value
    assert types["id"] == Canonical.BIGINT.value


def test_a_load_in_chunks_gives_the_same_tables_as_one_merge(tmp_path):
    def build(root, chunk_rows):
        h = Harness(root)
        h.wh.chunk_rows = chunk_rows
        paths = [
            h.write(CLAIMS, [record(CLAIMS, 1, total_claim_amount="1"), record(CLAIMS, 2)], day=0),
            h.write(CLAIMS, [record(CLAIMS, 1, total_claim_amount="2", updated_at="2026-03-01")]),
            h.write(CLAIMS, [record(CLAIMS, 1, total_claim_amount="3", updated_at="2026-01-01")]),
            h.write(CLAIMS, [record(CLAIMS, 3)], day=1),
        ]
        result = h.wh.load(CLAIMS, paths, run_id="r", snapshot=True)
        state = h.rows(
            'SELECT "id", "total_claim_amount", "_deleted_at" FROM "clinical"."claims" ORDER BY 1'
        )
        h.close()
        return result, state

    whole, whole_state = build(tmp_path / "whole", 1000)
    chunked, chunked_state = build(tmp_path / "chunked", 1)
    assert whole_state == chunked_state
    assert [amount for _, amount, _ in whole_state] == [
        Decimal("2"),
        Decimal("2.5"),
        Decimal("3.5"),
    ]
    assert (whole.soft_deleted, chunked.soft_deleted) == (0, 0)
    assert whole.inserted == chunked.inserted == 3


def test_memory_is_capped_and_a_bad_cap_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_MEMORY_LIMIT", "300MB")
    with Warehouse(tmp_path / "wh.duckdb") as wh:
        (limit,) = wh.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert limit == "286.1 MiB"  # DuckDB reports 300 MB in MiB

    monkeypatch.setenv("WAREHOUSE_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="WAREHOUSE_MEMORY_LIMIT: expected a size"):
        Warehouse(tmp_path / "wh.duckdb").open()


def test_rows_staged_at_once_follow_the_memory_cap():
    from warehouse.load import chunk_rows_for

    assert chunk_rows_for("128MB") == 25_600  # half the cap at 2.5 KB a staged row
    assert chunk_rows_for("1GiB") == 200_000 and chunk_rows_for("16MB") == 20_000
