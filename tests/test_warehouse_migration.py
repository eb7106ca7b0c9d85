"""A warehouse and a lake written before issue 29 (tests/fixtures/before_issue_29, made by
main's code at f95e5f9): the warehouse is retyped in place, its sets are read whole on the
next run with one log line that says why, and the old lake batches still load and rebuild,
cast on read."""

from __future__ import annotations

import logging
import shutil
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from connectors.clinical_records.catalogue import ALL_ENTITIES, CLAIMS, DOCUMENTS, PATIENTS
from sync.state import CommittedState
from sync.strategy import Mode, Options, plan
from tests.fixtures.before_issue_29.make import record
from tests.warehouse_records import T0, contents
from warehouse import ddl, migrations, ops
from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.normalise import normalise
from warehouse.rebuild import rebuild

FIXTURE = Path(__file__).parent / "fixtures" / "before_issue_29"
MIGRATION_LOG = "warehouse.migrations"


def old_warehouse(path: Path) -> Path:
    """The fixture's warehouse as main's code left it (DuckDB's EXPORT DATABASE, imported)."""
    export = FIXTURE / "warehouse"
    with duckdb.connect(str(path)) as con:
        con.execute((export / "schema.sql").read_text())
        con.execute((export / "load.sql").read_text().replace("{FIXTURE}", str(export)))
    return path


def old_lake(root: Path) -> Path:
    shutil.copytree(FIXTURE / "lake", root)
    return root


def declared_types(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str], str]:
    """(schema, table, column) -> DuckDB's name of the type the DDL declares, for every
    catalogue field in clinical and the superseded history."""
    out = {}
    for ent in ALL_ENTITIES:
        for schema, table in ((ddl.CLINICAL, ent.table), (ddl.HISTORY, ddl.superseded_table(ent))):
            for name, (kind, _) in ddl.field_columns(ent).items():
                (out[(schema, table, name)],) = con.execute(
                    f"SELECT typeof(CAST(NULL AS {kind}))"
                ).fetchone()
    return out


def held_types(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str], str]:
    rows = con.execute(
        "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns()"
    ).fetchall()
    return {(s, t, c): kind for s, t, c, kind in rows}


def test_an_old_warehouse_is_retyped_in_place_and_read_whole_next(tmp_path, caplog):
    path = old_warehouse(tmp_path / "warehouse.duckdb")
    with duckdb.connect(str(path), read_only=True) as con:
        assert held_types(con)[("clinical", "patients", "id")] == "BIGINT"  # main's rule
    caplog.set_level(logging.INFO, logger=MIGRATION_LOG)

    with Warehouse(path) as wh:
        wh.ensure_schema()
        con = wh.con
        types = held_types(con)
        for place, kind in declared_types(con).items():
            assert types[place] == kind, place
        assert types[("ops", "document_content", "patient_id")] == "VARCHAR"
        # Values survive: a number as its decimal text, decimals widened, an instant as text.
        assert con.execute('SELECT "id" FROM "clinical"."patients" ORDER BY 1').fetchall() == [
            ("123",),
            ("2",),
            ("3",),
        ]
        amounts = dict(
            con.execute('SELECT "id", "total_claim_amount" FROM "clinical"."claims"').fetchall()
        )
        assert amounts == {1: Decimal("13.25"), 2: Decimal("2.5"), 3: Decimal("3.5")}
        created = con.execute(
            'SELECT DISTINCT "created_at" FROM "clinical"."prescriptions"'
        ).fetchall()
        assert created == [("2026-02-01 09:00:00+00",)]  # the instant held, written in UTC
        history = con.execute(
            'SELECT "total_claim_amount" FROM "history"."claims" WHERE "id" = 1 ORDER BY "_valid_from"'
        ).fetchall()
        assert history == [(Decimal("1.5"),), (Decimal("13.25"),)]
        state = con.execute(
            'SELECT "entity", "watermark", "last_snapshot_at" FROM "ops"."sync_state"'
        ).fetchall()
    # Every set came through the old rule (AppointmentTypes too, though none of its columns
    # changed: its rejects and its offset-less date-times), so every set is read whole next.
    reset = {name for name, watermark, snapshot in state if watermark is None and snapshot is None}
    assert reset == {e.name for e in ALL_ENTITIES}
    said = [r.getMessage() for r in caplog.records if r.name == MIGRATION_LOG]
    assert len(said) == 1 and "read whole on the next run: Patients" in said[0]
    assert '"00123" and "123" merged' in said[0] and "AppointmentTypes retyped" not in said[0]
    with CommittedState(path) as committed:
        for entity in (PATIENTS, CLAIMS):
            decided = plan(entity, committed.state(entity), Options())
            assert decided.mode is Mode.SNAPSHOT, decided

    caplog.clear()
    with Warehouse(path) as wh:  # applied once: the next start changes nothing
        wh.ensure_schema()
    assert not [r for r in caplog.records if r.name == MIGRATION_LOG]


def write_as_sent(lake: Lake, day: int) -> dict[str, Path]:
    """The fixture's records as the service sends them, read whole again (format 2)."""
    files = {}
    for n, entity in enumerate((PATIENTS, CLAIMS, DOCUMENTS), start=1):
        records = [record(entity, i) for i in (1, 2, 3)]
        if entity is PATIENTS:
            records[0]["id"] = "00123"
            records.append(record(entity, 4, created_by_id="dr.jones"))
        if entity is CLAIMS:
            records[0]["total_claim_amount"] = "13.25"
        if entity is DOCUMENTS:
            records[0]["patient_id"] = "00123"
        batch = normalise(entity, records)
        files[entity.name] = lake.write(
            entity,
            batch.table,
            run_id=f"after-{n}",
            extracted_at=T0 + timedelta(days=day, seconds=n),
            rejects=batch.rejects,
            snapshot_complete=True,
            watermark="2026-02-05T09:00:00+00:00",
        )
    return files


def test_sets_read_again_replace_what_the_old_rule_lost_and_the_lake_rebuilds(tmp_path):
    path = old_warehouse(tmp_path / "warehouse.duckdb")
    lake = Lake(old_lake(tmp_path / "lake"))
    files = write_as_sent(lake, day=5)
    with Warehouse(path) as wh:
        wh.ensure_schema()
        results = {}
        for name, file in files.items():
            info = Lake.info(file)
            results[name] = wh.load(
                name, [file], run_id=info.run_id, snapshot=True, watermark=info.watermark
            )
        patients = wh.con.execute(
            'SELECT "id" FROM "clinical"."patients" WHERE "_deleted_at" IS NULL ORDER BY 1'
        ).fetchall()
        documents = wh.con.execute(
            'SELECT DISTINCT "patient_id" FROM "clinical"."patient_documents" '
            'WHERE "_deleted_at" IS NULL ORDER BY 1'
        ).fetchall()
    # "00123" and the patient the old rule rejected are back; "123" was never sent.
    assert patients == [("00123",), ("2",), ("3",), ("4",)]
    # The old rule's reject of patient 4 stays as history, resolved by the read that loaded
    # it, and `status` no longer counts it.
    with Warehouse(path) as wh:
        resolved = wh.con.execute(
            'SELECT "key", "resolved_run_id" FROM "ops"."rejects" WHERE "kind" = \'reject\''
        ).fetchall()
        rejects = {s.entity: s.rejects for s in wh.status()}
    assert resolved == [("4", "after-1")] and rejects["Patients"] == 0
    assert documents == [("00123",), ("2",), ("3",)]
    assert (results["Patients"].inserted, results["Patients"].soft_deleted) == (2, 1)
    # Claims as sent again are the same content: not a new version of every record.
    assert (results["Claims"].unchanged, results["Claims"].updated) == (3, 0)

    rebuilt = rebuild(lake.root, tmp_path / "rebuilt.duckdb")
    assert rebuilt["Claims"].fetched == 3 + 1 + 3  # two old batches, the new one
    # The lake alone gives back the same warehouse: the old batches cast on read as the
    # migration cast the tables, the same sets to read whole next.
    assert contents(tmp_path / "rebuilt.duckdb") == contents(path)


@pytest.mark.parametrize("with_new_snapshot", [False, True])
def test_old_lake_batches_rebuild_cast_on_read(tmp_path, caplog, with_new_snapshot):
    lake = Lake(old_lake(tmp_path / "lake"))
    if with_new_snapshot:
        write_as_sent(lake, day=5)
    caplog.set_level(logging.INFO, logger=MIGRATION_LOG)
    target = tmp_path / "rebuilt.duckdb"
    rebuild(lake.root, target)
    with Warehouse(target, read_only=True) as wh:
        types = held_types(wh.con)
        for place, kind in declared_types(wh.con).items():
            assert types[place] == kind, place
        amounts = dict(
            wh.con.execute('SELECT "id", "total_claim_amount" FROM "clinical"."claims"').fetchall()
        )
        reset = {
            name
            for (name,) in wh.con.execute(
                'SELECT "entity" FROM "ops"."sync_state" WHERE "watermark" IS NULL'
            ).fetchall()
        }
    assert amounts == {1: Decimal("13.25"), 2: Decimal("2.5"), 3: Decimal("3.5")}
    # A set whose newest full read came under the old rule is read whole next.
    replaced = {"Patients", "Claims", "Documents"} if with_new_snapshot else set()
    assert reset == {e.name for e in ALL_ENTITIES} - replaced
    said = [r.getMessage() for r in caplog.records if r.name == MIGRATION_LOG]
    assert len(said) == 1 and "rebuilt from lake batches of an older format" in said[0]


def test_notes_of_a_warehouse_read_again_before_notes_were_resolved_resolve_on_upgrade(tmp_path):
    """A warehouse migrated and read again by a version that kept every note open: the next
    schema change resolves the notes whose key loaded since, as a load would have."""
    path = old_warehouse(tmp_path / "warehouse.duckdb")
    lake = Lake(old_lake(tmp_path / "lake"))
    with Warehouse(path) as wh:
        wh.ensure_schema()
        for file in write_as_sent(lake, day=5).values():
            info = Lake.info(file)
            wh.load(info.entity, [file], run_id=info.run_id, snapshot=True)
        resolved = (
            'SELECT "key", "resolved_at", "resolved_run_id" FROM "ops"."rejects" ORDER BY ALL'
        )
        as_loaded = wh.con.execute(resolved).fetchall()
        assert [k for k, at, _ in as_loaded if at is not None] == ["4"]
        wh.con.execute('UPDATE "ops"."rejects" SET "resolved_at" = NULL, "resolved_run_id" = NULL')
        wh.con.execute('DELETE FROM "ops"."schema_version"')  # as a new DDL would
        assert {s.entity: s.rejects for s in wh.status()}["Patients"] == 1
        wh.ensure_schema()
        assert wh.con.execute(resolved).fetchall() == as_loaded
        assert {s.entity: s.rejects for s in wh.status()}["Patients"] == 0


def _catalog(path: Path) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(
            """SELECT schema_name, table_name, column_name, data_type, comment
               FROM duckdb_columns() WHERE NOT internal
               UNION ALL
               SELECT schema_name, table_name, NULL, NULL, comment
               FROM duckdb_tables() WHERE NOT internal
               ORDER BY ALL"""
        ).fetchall()


def test_a_new_warehouse_skips_the_upgrades_and_gets_the_same_schema(tmp_path):
    """A new warehouse is made without the ALTERs that extend an older one's tables: the same
    tables, columns, types and comments as running every statement, and the same fingerprint
    recorded (the next start skips the DDL)."""
    with Warehouse(tmp_path / "new.duckdb") as wh:
        wh.ensure_schema()
    with duckdb.connect(str(tmp_path / "all.duckdb")) as con:
        for statement in ddl.statements(ALL_ENTITIES):
            con.execute(statement)
    assert _catalog(tmp_path / "new.duckdb") == _catalog(tmp_path / "all.duckdb")
    assert len(_catalog(tmp_path / "new.duckdb")) > 500
    with duckdb.connect(str(tmp_path / "new.duckdb"), read_only=True) as con:
        assert ops.applied_schema(con) == migrations.fingerprint(ddl.statements(ALL_ENTITIES))
    upgrades = [s for s in ddl.statements(ALL_ENTITIES) if s.startswith("ALTER TABLE")]
    assert upgrades and not any(
        s.startswith("ALTER TABLE") for s in ddl.statements(ALL_ENTITIES, upgrades=False)
    )


def test_an_older_warehouses_table_gains_its_missing_column(tmp_path):
    path = tmp_path / "old.duckdb"
    with Warehouse(path) as wh:
        wh.ensure_schema()
        wh.con.execute('ALTER TABLE clinical.patients DROP COLUMN "active"')
        wh.con.execute("DELETE FROM ops.schema_version")  # as made by an older catalogue
    with Warehouse(path) as wh:
        wh.ensure_schema()
        columns = [
            r[0]
            for r in wh.con.execute(
                "SELECT column_name FROM duckdb_columns() "
                "WHERE schema_name = 'clinical' AND table_name = 'patients'"
            ).fetchall()
        ]
    assert "active" in columns
