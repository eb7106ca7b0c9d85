"""Every statement over the `ops` schema but the record of runs (`warehouse/runs.py`) and
what a merge reads and records (`warehouse/ledger.py`): schema version, source, sync state and
watermarks, status, the analytics models' builds, document content. The tables themselves are
declared in `warehouse/ddl.py`.

Callers own the transaction (a load writes its state with its rows, `Warehouse.load`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import duckdb

from connectors.clinical_records.catalogue import DOCUMENTS, EntitySet
from warehouse.connection import Transaction
from warehouse.ddl import CLINICAL, OPS
from warehouse.ident import qualified
from warehouse.lake import BatchInfo
from warehouse.normalise import REJECT, UNFIT
from warehouse.runs import SetResult, last_set_results


@dataclass(frozen=True)
class EntityStatus:
    entity: str
    table: str
    rows: int
    deleted: int
    rejects: int
    unfit: int  # records loaded with a value that did not fit its column (kept in _extras)
    watermark: str | None
    last_run_id: str | None
    last_loaded_at: datetime | None
    last_result: SetResult | None = None  # None before the set's first recorded result


# -- schema version ------------------------------------------------------------------------


def applied_schema(con: duckdb.DuckDBPyConnection) -> str | None:
    """The fingerprint of the DDL last applied; None before the first (no ops schema yet)."""
    try:
        row = con.execute('SELECT "fingerprint" FROM "ops"."schema_version"').fetchone()
    except duckdb.CatalogException:
        return None
    return row[0] if row else None


def holds(con: duckdb.DuckDBPyConnection, *tables: str) -> bool:
    """Whether every one of these ops tables exists (a file no sync set up has none)."""
    (found,) = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name IN "
        "(SELECT unnest(?))",
        [OPS, list(tables)],
    ).fetchone()
    return found == len(tables)


def record_schema(con: duckdb.DuckDBPyConnection, fingerprint: str) -> None:
    con.execute('DELETE FROM "ops"."schema_version"')
    con.execute('INSERT INTO "ops"."schema_version" VALUES (?, now())', [fingerprint])


def schema_applied_at(con: duckdb.DuckDBPyConnection) -> datetime | None:
    (applied,) = con.execute('SELECT max("applied_at") FROM "ops"."schema_version"').fetchone()
    return applied


# -- source --------------------------------------------------------------------------------


def source(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """The (base_url, customer) the warehouse was built from; None before the first load."""
    row = con.execute('SELECT "base_url", "customer" FROM "ops"."source"').fetchone()
    return (row[0], row[1]) if row else None


def record_source(con: duckdb.DuckDBPyConnection, base_url: str, customer: str) -> None:
    con.execute('DELETE FROM "ops"."source"')
    con.execute('INSERT INTO "ops"."source" VALUES (?, ?, now())', [base_url, customer])


# -- sync state ----------------------------------------------------------------------------


def watermark(con: duckdb.DuckDBPyConnection, entity: str) -> str | None:
    row = con.execute(
        'SELECT "watermark" FROM "ops"."sync_state" WHERE "entity" = ?', [entity]
    ).fetchone()
    return row[0] if row else None


def sync_state(
    con: duckdb.DuckDBPyConnection, entity: str
) -> tuple[str | None, datetime | None, str | None] | None:
    """(watermark, last_snapshot_at, range_position) of one set; None before its first load."""
    row = con.execute(
        'SELECT "watermark", "last_snapshot_at", "range_position" FROM "ops"."sync_state" '
        'WHERE "entity" = ?',
        [entity],
    ).fetchone()
    return (row[0], row[1], row[2]) if row else None


def last_loads(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """Per set, when its last load committed."""
    rows = con.execute(
        'SELECT "entity", "last_loaded_at" FROM "ops"."sync_state" '
        'WHERE "last_loaded_at" IS NOT NULL'
    ).fetchall()
    return dict(rows)


def coverage(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Per set: since when every record was read (a snapshot or a completed rotation of key
    ranges), and when a key range was last read."""
    rows = con.execute(
        'SELECT "entity", greatest("covered_at", "last_snapshot_at"), "range_read_at" '
        'FROM "ops"."sync_state"'
    ).fetchall()
    return {name: (covered, ranged) for name, covered, ranged in rows}


def write_state(
    con: duckdb.DuckDBPyConnection,
    entity: str,
    run_id: str,
    infos: Sequence[BatchInfo],
    snapshot: bool,
    watermark: str | None,
) -> None:
    """The watermark of the newest extraction wins: a run that commits after a run it
    started before (overlapping runs) leaves the later run's watermark."""
    newest = max((i.extracted for i in infos), default=None)
    con.execute(
        'INSERT INTO "ops"."sync_state" ("entity") SELECT ? '
        'WHERE NOT EXISTS (SELECT 1 FROM "ops"."sync_state" WHERE "entity" = ?)',
        [entity, entity],
    )
    con.execute(
        'UPDATE "ops"."sync_state" SET "watermark" = CASE '
        'WHEN ?::TIMESTAMPTZ < "last_extracted_at" THEN "watermark" '
        'ELSE coalesce(?, "watermark") END, '
        '"last_run_id" = ?, "last_loaded_at" = now(), '
        '"last_extracted_at" = greatest("last_extracted_at", ?::TIMESTAMPTZ), '
        '"last_snapshot_at" = CASE WHEN ? THEN greatest("last_snapshot_at", ?::TIMESTAMPTZ) '
        'ELSE "last_snapshot_at" END WHERE "entity" = ?',
        [newest, watermark, run_id, newest, snapshot and newest is not None, newest, entity],
    )
    ranged = [i for i in infos if i.key_range is not None]
    if ranged:
        _advance_range(con, entity, max(ranged, key=lambda i: i.extracted))


def _advance_range(con: duckdb.DuckDBPyConnection, entity: str, info: BatchInfo) -> None:
    """A key range read whole: the rotation moves on to its end; one that began at the
    first key starts a rotation, one that reached the last key completes it (every record
    was then read at or after the rotation began)."""
    low, high = info.key_range or (None, None)
    con.execute(
        'UPDATE "ops"."sync_state" SET "range_position" = ?, '
        '"range_started_at" = CASE WHEN ? OR "range_started_at" IS NULL '
        'THEN ?::TIMESTAMPTZ ELSE "range_started_at" END, '
        '"range_read_at" = greatest("range_read_at", ?::TIMESTAMPTZ) WHERE "entity" = ?',
        [high, low is None, info.extracted, info.extracted, entity],
    )
    if high is None:  # the rotation is complete: it covered the set from when it began
        con.execute(
            'UPDATE "ops"."sync_state" SET "covered_at" = '
            'greatest("covered_at", "range_started_at"), '
            '"range_started_at" = NULL WHERE "entity" = ?',
            [entity],
        )


def status(con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]) -> list[EntityStatus]:
    """Per entity set: rows, soft-deleted rows, rejects, values kept raw, watermark, last load
    and how the set's last run ended."""
    results = last_set_results(con)
    out = []
    for ent in entities:
        rows, deleted = con.execute(
            f'SELECT count(*), count("_deleted_at") FROM {qualified(CLINICAL, ent.table)}'
        ).fetchone()
        rejects, unfit = con.execute(  # the notes still the latest word on their record
            'SELECT count(*) FILTER ("kind" = ?), count(*) FILTER ("kind" = ?) '
            'FROM "ops"."rejects" WHERE "entity" = ? AND "resolved_at" IS NULL',
            [REJECT, UNFIT, ent.name],
        ).fetchone()
        state = con.execute(
            'SELECT "watermark", "last_run_id", "last_loaded_at" FROM "ops"."sync_state" '
            'WHERE "entity" = ?',
            [ent.name],
        ).fetchone() or (None, None, None)
        out.append(
            EntityStatus(
                ent.name, ent.table, rows, deleted, rejects, unfit, *state, results.get(ent.name)
            )
        )
    return out


# -- analytics models ----------------------------------------------------------------------


def record_models(con: duckdb.DuckDBPyConnection, built: Sequence[tuple[str, str, int]]) -> None:
    """The models just built, (name, fingerprint of its SQL, rows), replacing the last builds."""
    con.execute('DELETE FROM "ops"."models"')
    con.executemany('INSERT INTO "ops"."models" VALUES (?, ?, now(), ?)', list(built))


def models_built(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, datetime]]:
    """Per model: the fingerprint of the SQL its table was built from, and when."""
    rows = con.execute('SELECT "name", "fingerprint", "built_at" FROM "ops"."models"').fetchall()
    return {name: (fingerprint, at) for name, fingerprint, at in rows}


# -- document content ------------------------------------------------------------------------

CONTENT_TABLE = qualified(OPS, "document_content")
DOCUMENTS_TABLE = qualified(CLINICAL, DOCUMENTS.table)


def held_content(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Per live document: (patient, id, size, content type, sha256 held, size held)."""
    return con.execute(
        f'SELECT CAST(d."patient_id" AS VARCHAR), d."id", d."file_size_bytes", d."content_type", '
        f'm."sha256", m."size" FROM {DOCUMENTS_TABLE} AS d '
        f'LEFT JOIN {CONTENT_TABLE} AS m ON m."document_id" = d."id" '
        f'WHERE d."_deleted_at" IS NULL ORDER BY d."id"'
    ).fetchall()


def record_content(con: duckdb.DuckDBPyConnection, rows: Sequence[tuple]) -> None:
    """This run's manifest rows replace any held for the same documents, together."""
    if not rows:
        return
    with Transaction(con):
        con.execute(
            f'DELETE FROM {CONTENT_TABLE} WHERE "document_id" IN '
            f"(SELECT unnest(CAST(? AS VARCHAR[])))",
            [[r[0] for r in rows]],
        )
        marks = ", ".join("?" for _ in rows[0])
        con.executemany(f"INSERT INTO {CONTENT_TABLE} VALUES ({marks})", list(rows))
