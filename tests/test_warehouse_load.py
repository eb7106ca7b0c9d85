"""Merging lake batches into DuckDB: idempotence, history versions, soft deletes, watermarks,
locks and guards (the warehouse's own records of a load: test_warehouse_load_records.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    CLAIMS,
    PATIENTS,
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


def test_a_batch_extracted_before_the_deleting_snapshot_does_not_bring_a_record_back(harness):
    # Two runs overlapped: the snapshot that saw claim 2 gone (day 1) loaded before an
    # incremental batch extracted earlier (day 0, which still had it), or a batch is loaded again.
    first = harness.write(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], day=0)
    late = harness.write(CLAIMS, [record(CLAIMS, 2, total_claim_amount="9")], day=0)
    harness.wh.load(CLAIMS, [first], run_id="r1")
    assert harness.sync(CLAIMS, [record(CLAIMS, 1)], day=1, snapshot=True).soft_deleted == 1
    again = harness.wh.load(CLAIMS, [first], run_id="again")
    assert (again.resurrected, again.updated, again.unchanged) == (0, 0, 2)
    changed = harness.wh.load(CLAIMS, [late], run_id="late")
    assert (changed.resurrected, changed.updated) == (0, 1)  # its content, still deleted
    assert harness.rows(
        'SELECT "id", "total_claim_amount"::DOUBLE, "_deleted_at" IS NOT NULL '
        'FROM "clinical"."claims" ORDER BY 1'
    ) == [(1, 1.5, False), (2, 9, True)]
    # As if the loads had committed in extraction order: the older version closed when the
    # newer was extracted, the newer one closed by the deletion.
    assert harness.rows(
        'SELECT "total_claim_amount"::DOUBLE, "_valid_to" IS NOT NULL FROM "history"."claims" '
        'WHERE "id" = 2 ORDER BY "_valid_from"'
    ) == [(2.5, True), (9, True)]


def test_keys_found_deleted_by_an_extraction_are_soft_deleted_as_of_it(harness):
    """Reconciliation's deletes (the lake's `_deletes/`): applied once, in the load's
    transaction, to live rows extracted no later than the batch; a first load too."""
    first = harness.sync(CLAIMS, [record(CLAIMS, i) for i in (1, 2, 3)], deletes=["3"])
    assert (first.inserted, first.soft_deleted) == (3, 1)
    path = harness.write(CLAIMS, [record(CLAIMS, 4)], day=1, deletes=["1", "99"])
    result = harness.wh.load(CLAIMS, [path], run_id="r2", snapshot=False)
    assert (result.inserted, result.soft_deleted) == (1, 1)
    gone = harness.rows(
        'SELECT "id", "_deleted_at" = ? FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL '
        "ORDER BY 1",
        [Lake.info(path).extracted],
    )
    assert gone == [(1, True), (3, False)]
    again = harness.wh.load(CLAIMS, [path], run_id="r2", snapshot=False)
    assert again.soft_deleted == 0
    # A delete extracted before a newer version of the key was loaded leaves that version.
    harness.sync(CLAIMS, [record(CLAIMS, 2, updated_at="2026-03-01")], day=5)
    stale = harness.write(CLAIMS, [], day=3, deletes=["2"])
    assert harness.wh.load(CLAIMS, [stale], run_id="late", snapshot=False).soft_deleted == 0
    assert harness.rows('SELECT "_deleted_at" FROM "clinical"."claims" WHERE "id" = 2') == [(None,)]


def test_a_key_found_deleted_matches_the_key_held_as_sent_not_a_number_equal_to_it(harness):
    """The deletes are matched in the key's own type (a text cast of every key held read the
    table whole) and then as sent: "007", "7.0" and " 7" name no claim held, "7" does."""
    harness.sync(CLAIMS, [record(CLAIMS, i) for i in (7, 8)])
    path = harness.write(CLAIMS, [], day=1, deletes=["007", "7.0", " 7", "x"])
    assert harness.wh.load(CLAIMS, [path], run_id="r2").soft_deleted == 0
    path = harness.write(CLAIMS, [], day=2, deletes=["7"])
    assert harness.wh.load(CLAIMS, [path], run_id="r3").soft_deleted == 1
    assert harness.rows('SELECT "id" FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL') == [
        (7,)
    ]
    assert harness.rows(
        'SELECT "id", "change" FROM "analytics"."changes" WHERE "run_id" = ?', ["r3"]
    ) == [("7", "deleted")]


def test_a_new_record_extracted_before_a_snapshot_that_missed_it_loads_deleted(harness):
    # Overlapping runs: an incremental run extracted claims 3 and 4 (day 0); a snapshot
    # extracted on day 1, without claim 3 (deleted at the source since) and with claim 4
    # rejected (its key sent as text), committed first. Loaded in extraction order, 3 would
    # be marked by it.
    late = harness.write(CLAIMS, [record(CLAIMS, 3), record(CLAIMS, 4)], day=0)
    snapshot = harness.write(
        CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 4, id="4")], day=1, snapshot=True
    )
    harness.wh.load(CLAIMS, [snapshot], run_id="snapshot", snapshot=True)
    result = harness.wh.load(CLAIMS, [late], run_id="late")
    assert (result.inserted, result.soft_deleted) == (2, 0)
    seen_gone = Lake.info(snapshot).extracted
    assert harness.rows('SELECT "id", "_deleted_at" FROM "clinical"."claims" ORDER BY 1') == [
        (1, None),
        (3, seen_gone),
        (4, None),
    ]
    # A later batch brings it back as any deleted record.
    back = harness.sync(CLAIMS, [record(CLAIMS, 3)], day=2)
    assert back.resurrected == 1


def test_a_run_that_commits_after_a_later_extracted_one_leaves_its_watermark(harness):
    late = harness.write(CLAIMS, [record(CLAIMS, 2)], day=0)
    harness.wh.load(
        CLAIMS,
        [harness.write(CLAIMS, [record(CLAIMS, 1)], day=1)],
        run_id="later",
        watermark="2026-02-02",
    )
    harness.wh.load(CLAIMS, [late], run_id="earlier", watermark="2026-02-01")
    assert harness.wh.watermark(CLAIMS) == "2026-02-02"
    harness.wh.load(CLAIMS, [], run_id="nothing new", watermark="2026-02-03")
    assert harness.wh.watermark(CLAIMS) == "2026-02-03"


def test_a_warehouse_made_before_ops_snapshots_records_its_last_snapshot(harness):
    late = harness.write(CLAIMS, [record(CLAIMS, 2)], day=0)
    snapshot = harness.write(CLAIMS, [record(CLAIMS, 1)], day=1, snapshot=True)
    info = Lake.info(snapshot)
    harness.wh.load(CLAIMS, [snapshot], run_id=info.run_id, snapshot=True)
    harness.rows('DROP TABLE "ops"."snapshots"')
    harness.rows('DELETE FROM "ops"."schema_version"')

    harness.wh.ensure_schema()
    assert harness.rows('SELECT "entity", "run_id", "snapshot_at" FROM "ops"."snapshots"') == [
        ("Claims", info.run_id, info.extracted)
    ]
    harness.wh.load(CLAIMS, [late], run_id="late")
    assert harness.rows('SELECT "_deleted_at" FROM "clinical"."claims" WHERE "id" = 2') == [
        (info.extracted,)
    ]


def test_a_rejected_record_in_a_snapshot_is_not_marked_deleted(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], snapshot=True)
    result = harness.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2, id="2")], snapshot=True)
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


def test_versions_read_by_row_id_that_are_not_the_planned_ones_stop_the_load(harness, monkeypatch):
    """The merge reads and deletes the versions it replaces by the row ids its plan found;
    a plan whose row ids point at other records (each off by one) must not move their versions
    to history: the load stops, names the set and the counts, and writes nothing."""
    from warehouse import merge

    harness.sync(CLAIMS, [record(CLAIMS, i, total_claim_amount="1.00") for i in (1, 2, 3)])
    before = {name: harness.rows(f"SELECT * FROM {name} ORDER BY ALL") for name in TABLES}
    planned = merge.Merge._plan

    def shifted(self: merge.Merge) -> dict[str, int]:
        counts = planned(self)
        self.con.execute('UPDATE "_plan" SET "_clinical_row" = ("_clinical_row" + 1) % 3')
        return counts

    monkeypatch.setattr(merge.Merge, "_plan", shifted)
    changed = [record(CLAIMS, 1, total_claim_amount="2.00", updated_at="2026-02-02")]
    with pytest.raises(RuntimeError, match=r"Claims: the merge read 1 current versions by row"):
        harness.sync(CLAIMS, changed, day=1)
    assert {name: harness.rows(f"SELECT * FROM {name} ORDER BY ALL") for name in TABLES} == before


TABLES = ('"clinical"."claims"', '"history"."claims_superseded"', '"analytics"."changes"')
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
PROGRAM = """
import sys, time, duckdb
with duckdb.connect(sys.argv[1]):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize(
    ("code", "said"),
    [(HOLDER, "being written by process {pid} "), (PROGRAM, "held by process {pid} ")],
    ids=["a-writer", "a-program"],
)
def test_a_locked_warehouse_gives_a_clear_error(tmp_path, code, said):
    """Another writer holds the writer lock (warehouse/writer.py); a program that opened the
    file itself, DuckDB's: either is named, and a writer that may wait gets it after."""
    path = tmp_path / "locked.duckdb"
    with Warehouse(path) as wh:
        wh.ensure_schema()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), str(path), "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(WarehouseLocked, match=said.format(pid=holder.pid)) as err:
            Warehouse(path).open()
        assert str(path) in str(err.value)
        if code == PROGRAM:
            assert "WAREHOUSE_PATH read-only" in str(err.value)  # what to do instead
            with pytest.raises(WarehouseLocked):
                status(path)
        with Warehouse(path, wait=30) as wh:  # waits for the holder to finish
            assert wh.watermark("Claims") is None
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


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
