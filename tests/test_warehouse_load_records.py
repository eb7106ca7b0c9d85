"""The warehouse's own records of a load: notes of what was rejected and what a later read
loaded, the record of a run from how it ended, the catalogue's canonical types as the tables'
types, every version of a key in history, and the memory cap."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    CLAIMS,
    PATIENTS,
    Canonical,
)
from tests.warehouse_records import Harness, record
from warehouse import ledger
from warehouse.load import Warehouse
from warehouse.normalise import REJECT
from warehouse.runs import KILLED, SUCCESS, RunEnding, SetResult


def notes(harness, kind: str) -> list[tuple]:
    return harness.rows(
        'SELECT "key", "run_id", "resolved_run_id" FROM "ops"."rejects" WHERE "kind" = ? '
        "ORDER BY ALL",
        [kind],
    )


def counted(harness) -> tuple[int, int]:
    """(rejects, values kept raw) of Claims as `status` counts them."""
    claims = {s.entity: s for s in harness.wh.status()}["Claims"]
    return claims.rejects, claims.unfit


def rejected_keys(harness) -> set:
    """The keys reconciliation counts as held though rejected (sync/state.py)."""
    return set(ledger.rejected_keys(harness.wh.con, "Claims", REJECT))


def test_a_note_whose_key_a_later_read_loads_is_history_and_status_counts_the_rest(harness):
    # Run 1: claim "5" sent as a string (no usable key) and claim 6 with an amount that does
    # not fit; run 2 reads both again, claim 5 fixed and 6 still unfit; run 3 fixes 6.
    harness.sync(CLAIMS, [record(CLAIMS, 5, id="5"), record(CLAIMS, 6, uncollected="1e5")])
    assert counted(harness) == (1, 1)
    assert rejected_keys(harness) == {"5"}
    harness.sync(CLAIMS, [record(CLAIMS, 5), record(CLAIMS, 6, uncollected="1e5")], day=1)
    assert notes(harness, "reject") == [("5", "run-001", "run-002")]  # kept, resolved
    assert notes(harness, "unfit") == [("6", "run-001", "run-002"), ("6", "run-002", None)]
    assert counted(harness) == (0, 1)
    assert rejected_keys(harness) == set()  # a resolved reject is not a key held
    harness.sync(CLAIMS, [record(CLAIMS, 6)], day=2)
    assert counted(harness) == (0, 0)
    # A reject after its key loaded stays open: the table holds an older version than the
    # source last sent (claim 6); claim 7's reject is resolved as before.
    harness.sync(CLAIMS, [record(CLAIMS, 7, id="7")], day=3)
    harness.sync(CLAIMS, [record(CLAIMS, 6, id="6"), record(CLAIMS, 7)], day=3)
    assert counted(harness) == (1, 0)
    assert notes(harness, "reject")[-1] == ("7", "run-004", "run-005")


def test_resolve_notes_stages_what_was_sent_itself_and_leaves_nothing_behind(harness):
    """ledger.resolve_notes owns its `_sent`: made from the caller's SELECT, dropped after; with
    no note open the SELECT (a load's read of every batch's keys) is not run at all."""
    harness.sync(CLAIMS, [record(CLAIMS, 6, uncollected="1e5")])
    con = harness.wh.con
    sent = 'SELECT ? AS "key", now() AS "extracted_at", \'run-x\' AS "run_id"'
    ledger.resolve_notes(con, "Claims", sent, ["6"])
    assert notes(harness, "unfit") == [("6", "run-001", "run-x")]
    staged = "SELECT count(*) FROM duckdb_tables() WHERE table_name = '_sent'"
    assert con.execute(staged).fetchone() == (0,)
    ledger.resolve_notes(con, "Claims", "SELECT * FROM no_such_table")  # nothing open: not run


def test_a_run_is_recorded_once_from_how_it_ended_with_its_sets_sums(harness):
    started = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    for entity, records in (
        (CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)]),
        (PATIENTS, [record(PATIENTS, 7)]),
    ):
        loaded = harness.sync(entity, records)
        with harness.wh.transaction():
            result = SetResult(entity.name, "snapshot", len(records), 0)
            harness.wh.record_set_result("r2", result, vars(loaded))
    assert harness.rows('SELECT count(*) FROM "ops"."sync_runs"') == [(0,)]  # loads: no verdict
    ending = RunEnding("r2", SUCCESS, started, entities=("Claims",), full_snapshot=True)
    assert harness.wh.end_run(ending)
    assert not harness.wh.end_run(RunEnding("r2", KILLED, started))  # the first ending stands
    assert harness.rows(
        'SELECT "status", "entities", "full_snapshot", "fetched", "inserted", "exact", '
        '"started_at", "finished_at" >= "started_at" FROM "ops"."sync_runs"'
    ) == [("success", ["Claims", "Patients"], True, 3, 3, True, started, True)]


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


@pytest.mark.parametrize("held", [False, True], ids=["into-empty", "into-held"])
def test_versions_of_a_key_across_batches_keep_the_newest_current_and_all_in_history(
    tmp_path, held
):
    h = Harness(tmp_path)
    if held:  # the same load merging into rows already there, not a fresh insert
        h.sync(CLAIMS, [record(CLAIMS, 1, total_claim_amount="0.5", updated_at="2025-12-01")])
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
    versions = h.rows(
        'SELECT "total_claim_amount" FROM "history"."claims" WHERE "id" = 1 ORDER BY "updated_at"'
    )
    h.close()
    assert [(key, amount) for key, amount, _ in state] == [
        (1, Decimal("2")),
        (2, Decimal("2.5")),
        (3, Decimal("3.5")),
    ]
    assert all(deleted is None for _, _, deleted in state)
    assert (result.inserted, result.updated, result.soft_deleted) == (
        (2, 3, 0) if held else (3, 2, 0)
    )
    every = [Decimal("3"), Decimal("1"), Decimal("2")]  # by updated_at, oldest first
    assert [v for (v,) in versions] == ([Decimal("0.5")] if held else []) + every


def test_history_is_the_superseded_versions_and_the_current_rows(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1, total_claim_amount="1"), record(CLAIMS, 2)], day=0)
    harness.sync(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="2", updated_at="2026-03-01")], day=1
    )
    assert harness.rows('SELECT "id", "total_claim_amount" FROM "history"."claims_superseded"') == [
        (1, Decimal("1"))
    ]
    kinds = dict(
        harness.rows(
            "SELECT table_name, table_type FROM information_schema.tables "
            "WHERE table_schema = 'history' AND table_name LIKE 'claims%'"
        )
    )
    assert kinds == {"claims": "VIEW", "claims_superseded": "BASE TABLE"}


def test_a_warehouse_with_history_tables_moves_to_the_history_views(harness):
    """Warehouses made before history became a view held every version in the table."""
    harness.sync(CLAIMS, [record(CLAIMS, 1, total_claim_amount="1"), record(CLAIMS, 2)], day=0)
    harness.sync(
        CLAIMS, [record(CLAIMS, 1, total_claim_amount="2", updated_at="2026-03-01")], day=1
    )
    harness.sync(
        CLAIMS,
        [record(CLAIMS, 1, total_claim_amount="2", updated_at="2026-03-01")],
        day=2,
        snapshot=True,
    )
    every_version = harness.rows('SELECT * FROM "history"."claims" ORDER BY ALL')
    con = harness.wh.con
    for statement in (
        'CREATE TABLE "history"."old" AS SELECT * FROM "history"."claims"',
        'DROP VIEW "history"."claims"',
        'DROP TABLE "history"."claims_superseded"',
        'ALTER TABLE "history"."old" RENAME TO "claims"',
        'DELETE FROM "ops"."schema_version"',
    ):
        con.execute(statement)

    harness.wh.ensure_schema()
    assert harness.rows('SELECT * FROM "history"."claims" ORDER BY ALL') == every_version
    assert harness.rows('SELECT count(*) FROM "history"."claims_superseded"') == [(1,)]
    assert len(every_version) == 3  # claim 1 twice, claim 2 once (deleted by the snapshot)


def test_memory_is_capped_and_a_bad_cap_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WAREHOUSE_MEMORY_LIMIT", "300MB")
    with Warehouse(tmp_path / "wh.duckdb") as wh:
        (limit,) = wh.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert limit == "286.1 MiB"  # DuckDB reports 300 MB in MiB

    monkeypatch.setenv("WAREHOUSE_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="WAREHOUSE_MEMORY_LIMIT: expected a size"):
        Warehouse(tmp_path / "wh.duckdb").open()
