"""`rebuild` recreates the warehouse from the lake alone and gives the same tables."""

from __future__ import annotations

import select
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS, PATIENTS
from tests.warehouse_records import Harness, analytics_rows, contents, record
from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.rebuild import rebuild
from warehouse.runs import FAILED, SUCCESS, RunEnding, SetResult, run_row


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
    h.wh.refresh_models()
    (deleted,) = h.rows('SELECT count(*) FROM "clinical"."claims" WHERE "_deleted_at" IS NOT NULL')
    assert deleted == (1,)
    h.close()
    original = contents(h.path)
    with Warehouse(h.path, read_only=True) as kept:
        models = analytics_rows(kept.con)
    assert len(original["history.claims"]) == 4 and len(original["ops.rejects"]) == 2

    copy = tmp_path / "rebuilt.duckdb"
    results = rebuild(h.lake.root, copy)
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
        assert views == [("sync_health",)]  # the one view: over ops, not a model


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


LOADER = """
import sys
from warehouse.lake import Lake
from warehouse.load import Warehouse
from connectors.clinical_records.catalogue import CLAIMS
path, batch, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
with Warehouse(path, wait=wait) as wh:
    info = Lake.info(batch)
    wh.load(CLAIMS, [batch], run_id=info.run_id, watermark=info.watermark)
print("committed", flush=True)
"""


def test_a_load_during_a_rebuild_waits_for_it_and_nothing_it_commits_is_lost(tmp_path, monkeypatch):
    """A sync's load (another process) started while the rebuild builds: it waits for the
    rebuild's writer lock, another writer that may not wait is refused with the rebuild
    named, and the load commits into the rebuilt file: nothing committed is deleted with
    the old one. Without the lock the load commits into the old file, which the rebuild's
    rename then drops."""
    h = Harness(tmp_path / "orig")
    h.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], snapshot=True)
    h.close()
    seen: dict[str, object] = {}
    build = Warehouse.refresh_models

    def while_building(self: Warehouse) -> dict[str, int]:
        """The rebuild has read the lake: a sync extracts a batch and loads it now."""
        batch = h.write(CLAIMS, [record(CLAIMS, 3)], day=1)
        loader = subprocess.Popen(
            [sys.executable, "-c", LOADER, str(h.path), str(batch), "60"],
            stdout=subprocess.PIPE,
            text=True,
        )
        ready, _, _ = select.select([loader.stdout], [], [], 5.0)
        seen["committed during the build"] = bool(ready)
        refused = subprocess.run(
            [sys.executable, "-c", LOADER, str(h.path), str(batch), "0"],
            capture_output=True,
            text=True,
        )
        seen["refused"] = refused.stderr
        seen["loader"] = loader
        return build(self)

    monkeypatch.setattr(Warehouse, "refresh_models", while_building)
    rebuild(h.lake.root, h.path)
    monkeypatch.undo()
    loader = seen["loader"]
    assert loader.wait(timeout=60) == 0 and loader.stdout.read().strip() == "committed"
    loader.stdout.close()
    assert seen["committed during the build"] is False  # it waited for the rebuild
    assert "WarehouseLocked" in seen["refused"] and "rebuild" in seen["refused"]
    with Warehouse(h.path, read_only=True) as wh:
        keys = wh.con.execute('SELECT "id" FROM "clinical"."claims" ORDER BY 1').fetchall()
    assert keys == [(1,), (2,), (3,)]  # the load that waited is in the rebuilt file


def test_a_rebuild_keeps_the_record_of_the_runs_and_adds_its_own(tmp_path):
    """Each run's row as it ended (status, times, exact, message) and its set results,
    from the old file; from the lake's copies when the file is lost; a run the lake knows by
    its batches alone is `unknown`; the rebuild adds a row of its own."""
    h = Harness(tmp_path / "orig")
    started = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    for n, status in ((1, SUCCESS), (2, FAILED)):
        loaded = h.sync(CLAIMS, [record(CLAIMS, n)], day=n)
        run_id = f"run-{h.runs:03d}"
        with h.wh.transaction():
            h.wh.record_set_result(run_id, SetResult("Claims", "incremental", n, 0), vars(loaded))
        ending = RunEnding(run_id, status, started, message="failed" if n == 2 else None)
        h.wh.end_run(ending)
        h.lake.record_run(run_row(h.wh.con, run_id))
    h.sync(CLAIMS, [record(CLAIMS, 9)], day=3)  # a run still going, or killed unnoticed
    columns = '"run_id", "status", "started_at", "finished_at", "exact", "message", "inserted"'
    before = {row[0]: row for row in h.rows(f'SELECT {columns} FROM "ops"."sync_runs"')}
    results = h.rows('SELECT * EXCLUDE ("recorded_at") FROM "ops"."set_results" ORDER BY ALL')
    h.close()

    def record_of(path: Path) -> tuple[dict[str, tuple], list[tuple]]:
        with Warehouse(path, read_only=True) as wh:
            rows = wh.con.execute(f'SELECT {columns} FROM "ops"."sync_runs"').fetchall()
            kept = wh.con.execute(
                'SELECT * EXCLUDE ("recorded_at") FROM "ops"."set_results" ORDER BY ALL'
            ).fetchall()
        return {row[0]: row for row in rows}, kept

    rebuild(h.lake.root, h.path)
    rows, kept = record_of(h.path)
    assert {k: rows[k] for k in before} == before and kept == results
    assert rows["run-003"][1] == "unknown" and rows["run-003"][4] is None
    (own,) = [row for key, row in rows.items() if key.startswith("rebuild-")]
    assert own[1] == "rebuilt" and own[4] is None and len(rows) == 4

    for lost in (h.path, h.path.with_name(h.path.name + ".wal")):
        lost.unlink(missing_ok=True)
    rebuild(h.lake.root, h.path)
    rows, kept = record_of(h.path)
    assert {k: rows[k] for k in before} == before  # the lake kept how each ended
    assert rows["run-003"][1] == "unknown"
    assert sorted(row[1] for key, row in rows.items() if key.startswith("rebuild-")) == [
        "rebuilt",
        "rebuilt",
    ]  # the first rebuild's row from the lake, and this one's
    assert kept == []  # set results live in the warehouse alone
