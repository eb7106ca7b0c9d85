"""Records as the API sends them, built from the catalogue, and a lake + warehouse harness."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import ALL_ENTITIES, Canonical, Edm, EntitySet, Field
from warehouse.dbt_project import DEFAULT_PROJECT, manifest_json, prepare
from warehouse.lake import Lake
from warehouse.load import LoadResult, Warehouse
from warehouse.models import Model, models, select_sql
from warehouse.normalise import normalise

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)

# A valid JSON value per field, by the field's spec type (and its stated format).
SAMPLE: dict[Edm | Canonical, Callable[[Field, int], object]] = {
    Edm.STRING: lambda f, i: f"{i % 100}{f.name}"[: f.max_length or 60],
    Edm.INT32: lambda f, i: i,
    Edm.DECIMAL: lambda f, i: f"{i}.5",
    Edm.BOOLEAN: lambda f, i: i % 2 == 0,
    Edm.DATE: lambda f, i: "2026-02-01",
    Edm.DATETIME: lambda f, i: "2026-02-01T10:00:00+01:00",
    Canonical.DATE: lambda f, i: "2026-02-01",
    Canonical.TIME: lambda f, i: "09:30:00",
}


def record(entity: EntitySet, i: int, **values: object) -> dict[str, object]:
    """A complete record of `entity` with key `i` (as the spec types it), then `values`."""
    out: dict[str, object] = {f.name: SAMPLE[f.parse_as or f.type](f, i) for f in entity.fields}
    if entity.key_field.type is Edm.STRING:
        out[entity.key] = f"{entity.table[:3]}-{i}"
    out.update(values)
    return out


class Harness:
    """A lake and a warehouse under tmp_path; `sync` normalises, writes a batch and loads it."""

    def __init__(self, root: Path, entities: Sequence[EntitySet] | None = None) -> None:
        self.lake = Lake(root / "lake")
        self.path = root / "warehouse.duckdb"
        kwargs = {"entities": entities} if entities is not None else {}
        self.wh = Warehouse(self.path, **kwargs)
        self.wh.open()
        self.wh.ensure_schema()
        self.runs = 0

    def write(
        self,
        entity: EntitySet,
        records: list,
        *,
        day: int = 0,
        snapshot: bool = False,
        deletes: Sequence[str] = (),
    ) -> Path:
        self.runs += 1
        batch = normalise(entity, records)
        return self.lake.write(
            entity,
            batch.table,
            run_id=f"run-{self.runs:03d}",
            extracted_at=T0 + timedelta(days=day, seconds=self.runs),
            rejects=batch.rejects,
            snapshot_complete=snapshot,
            watermark=f"w{self.runs}",
            deletes=deletes,
        )

    def sync(
        self, entity: EntitySet, records: list, *, snapshot: bool = False, **batch: Any
    ) -> LoadResult:
        """`write` (day, deletes) and load the batch at once."""
        path = self.write(entity, records, snapshot=snapshot, **batch)
        run_id = Lake.info(path).run_id
        return self.wh.load(
            entity, [path], run_id=run_id, snapshot=snapshot, watermark=f"w{self.runs}"
        )

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        return self.wh.con.execute(sql, list(params)).fetchall()

    def close(self) -> None:
        self.wh.close()


# Load-time columns differ by nature; everything else must come back identical.
LOAD_TIME = {"_synced_at", "loaded_at", "last_loaded_at", "recorded_at"}
OPS = ("rejects", "loaded_batches", "sync_state", "snapshots", "source")


def contents(path: str | Path) -> dict[str, list[tuple]]:
    """Every clinical, history and ops table as sorted text rows, load-time columns left out:
    what two warehouses built from the same lake must share."""
    with Warehouse(path, read_only=True) as wh:
        tables = [("clinical", e.table) for e in ALL_ENTITIES]
        tables += [("history", e.table) for e in ALL_ENTITIES]
        tables += [("ops", name) for name in OPS]
        out = {}
        for schema, table in tables:
            columns = [
                c
                for (c,) in wh.con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE schema_name = ? "
                    "AND table_name = ? ORDER BY column_index",
                    [schema, table],
                ).fetchall()
                if c not in LOAD_TIME
            ]
            if not columns:  # a warehouse of a few entity sets has no table of the others
                continue
            select = ", ".join(f'"{c}"::VARCHAR' for c in columns)
            out[f"{schema}.{table}"] = wh.con.execute(
                f'SELECT {select} FROM "{schema}"."{table}" ORDER BY ALL'
            ).fetchall()
        return out


def analytics_rows(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[list[str], list[str]]]:
    """Per model of transform/: (its table's rows, its SELECT's rows over the clinical tables
    now), both sorted as text: equal when the table is what the model says of the data beside
    it."""
    manifest = manifest_json(prepare())
    out = {}
    for model in models(manifest):
        table = con.execute(f'SELECT * FROM "analytics"."{model.name}"').fetchall()
        query = con.execute(select_sql(manifest, model)).fetchall()
        out[model.name] = (sorted(map(repr, table)), sorted(map(repr, query)))
    return out


def project_copy(root: Path, **models: str) -> Path:
    """A copy of transform/ with more models (`name=SQL`): an analytics team's own project,
    for CLINICAL_DBT_PROJECT."""
    project = root / "team_models"
    shutil.copytree(DEFAULT_PROJECT, project, ignore=shutil.ignore_patterns("target", "logs"))
    for name, sql in models.items():
        (project / "models" / f"{name}.sql").write_text(sql)
    return project


# The analytics team's model of the issue: claims per billing branch.
PER_BRANCH = (
    "select billing_branch_id, count(*) as claims "
    "from {{ source('clinical', 'claims') }} group by 1\n"
)


# The linked models of transform/, by table name.
MODELS = {
    "prescription_claims",
    "prescription_verifications",
    "prescription_summary",
    "broken_references",
}


def transform_models() -> list[Model]:
    return models(manifest_json(prepare()))
