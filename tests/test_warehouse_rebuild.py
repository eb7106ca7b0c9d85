"""`rebuild` recreates the warehouse from the lake alone and gives the same tables."""

from __future__ import annotations

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS, PATIENTS
from tests.warehouse_records import Harness, analytics_rows, contents, record
from warehouse import models as warehouse_models
from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.rebuild import rebuild


def test_rebuild_from_the_lake_equals_the_original(tmp_path):
    h = Harness(tmp_path / "orig")
    h.wh.check_source("https://svc.example/api", "acme")
    h.lake.record_source("https://svc.example/api", "acme")
    h.sync(PATIENTS, [record(PATIENTS, i, id=str(i)) for i in (1, 2, 3)], snapshot=True)
    h.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2), {"id": "x"}], snapshot=True)
    h.sync(
        CLAIMS,
        [record(CLAIMS, 1, total_claim_amount="9.99", updated_at="2026-02-03"), record(CLAIMS, 3)],
        day=1,
        deletes=["2"],  # found gone by the extraction's reconciliation
    )
    h.sync(PATIENTS, [record(PATIENTS, i, id=str(i)) for i in (1, 3)], day=1, snapshot=True)
    h.sync(APPOINTMENTS, [record(APPOINTMENTS, 1, patient_id="3", loyalty="gold")], day=1)
    h.sync(PATIENTS, [record(PATIENTS, i, id=str(i)) for i in (1, 2, 3)], day=2, snapshot=True)
    warehouse_models.build(h.path)
    (deleted,) = h.rows('SELECT count(*) FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL')
    assert deleted == (1,)
    h.close()
    original = contents(h.path)
    with Warehouse(h.path, read_only=True) as kept:
        models = analytics_rows(kept.con)
    assert len(original["history.claims"]) == 4 and len(original["ops.rejects"]) == 2

    copy = tmp_path / "rebuilt.duckdb"
    results = rebuild(h.lake.root, copy)
    warehouse_models.build(copy)
    assert results["Claims"].fetched == 5 and results["Patients"].resurrected == 1
    assert contents(copy) == original

    # Rebuilding over the original replaces it in place, with the same result.
    rebuild(h.lake.root, h.path)
    assert contents(h.path) == original
    # The analytics tables are built again, equal to the original's.
    with Warehouse(copy, read_only=True) as rebuilt:
        assert analytics_rows(rebuilt.con) == models and len(models) == 4
        views = rebuilt.con.execute(
            "SELECT view_name FROM duckdb_views() WHERE schema_name = 'analytics'"
        ).fetchall()
        assert sorted(views) == [("model_health",), ("sync_health",)]  # the DDL's, no model


def test_loads_out_of_extraction_order_rebuild_to_the_same_tables(tmp_path):
    # A snapshot (day 1) committed before an incremental run extracted the day before: a
    # record the snapshot missed, one it rejected, one the late batch changed.
    h = Harness(tmp_path / "orig")
    h.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], snapshot=True)
    late = h.write(
        CLAIMS, [record(CLAIMS, 2, total_claim_amount="9"), record(CLAIMS, 3), record(CLAIMS, 4)]
    )
    snapshot = h.write(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 4, id="4")], day=1, snapshot=True)
    for path, is_snapshot in ((snapshot, True), (late, False)):
        info = Lake.info(path)
        h.wh.load(
            CLAIMS, [path], run_id=info.run_id, snapshot=is_snapshot, watermark=info.watermark
        )
    deleted = h.rows('SELECT "id" FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL')
    assert sorted(deleted) == [(2,), (3,)]
    h.close()
    original = contents(h.path)
    assert len(original["ops.snapshots"]) == 2

    copy = tmp_path / "rebuilt.duckdb"
    rebuild(h.lake.root, copy)
    rebuilt = contents(copy)

    def state(tables: dict[str, list[tuple]]) -> list[tuple]:
        """sync_state without `last_run_id`: which run loaded last follows commit order."""
        return [row[:2] + row[3:] for row in tables.pop("ops.sync_state")]

    assert state(rebuilt) == state(original)
    assert rebuilt == original


def test_rebuild_of_an_empty_lake_gives_empty_tables(tmp_path):
    results = rebuild(tmp_path / "no-lake", tmp_path / "wh.duckdb")
    assert all(r.fetched == 0 for r in results.values())
    with Warehouse(tmp_path / "wh.duckdb", read_only=True) as wh:
        assert wh.status()[0].rows == 0
