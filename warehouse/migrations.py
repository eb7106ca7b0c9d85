"""Applying the DDL: skipped while its fingerprint is unchanged, with the shims that bring
warehouses made by older versions up to date in the same transaction."""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Collection, Iterable

import duckdb

from connectors.clinical_records.catalogue import EntitySet
from warehouse import ddl, ledger, ops
from warehouse.connection import Transaction
from warehouse.ident import column_list, qualified, quote
from warehouse.merge import CONTENT_HASH
from warehouse.normalise import REJECT
from warehouse.schema import EXTRAS

log = logging.getLogger(__name__)

# Why the sets of a warehouse made under the old typing rule are read whole again.
RETYPED_WHY = (
    "under the old typing rule ids of a family typed as a number anywhere were numbers "
    '("00123" and "123" merged), a date-time without an offset was taken as UTC and a value '
    "that did not fit rejected its record; only the source has them as sent"
)


def fingerprint(statements: Iterable[str]) -> str:
    """SHA-256 of the DDL statements, in order: what `ops.schema_version` remembers."""
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()


@functools.cache
def _ddl(entities: tuple[EntitySet, ...]) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The DDL of `entities`, the same without the upgrades (for a new warehouse), and its
    fingerprint, made once per process: a run's every load step asks, and writing out
    the statements to compare costs CPU each time."""
    statements = tuple(ddl.statements(entities))
    return statements, tuple(ddl.statements(entities, upgrades=False)), fingerprint(statements)


def ensure_schema(con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]) -> None:
    """Create (or extend) every schema, table and comment; safe to run on every start.

    Skipped when the DDL's fingerprint is the one last applied: every load step calls
    this, and re-running the statements cost half a second each time."""
    entities = tuple(entities)
    statements, for_new, applied = _ddl(entities)
    if ops.applied_schema(con) == applied:
        return
    if _is_new(con):
        statements = for_new  # no table an older catalogue made to bring up to date
    with Transaction(con):
        history_tables_to_views(con, entities)
        retyped = retype_columns(con, entities)
        for statement in statements:
            con.execute(statement)
        ledger.seed_snapshots(con)
        resolve_notes_loaded_since(con, entities)
        if retyped:  # every set came through the old rule: its rejects, its silent UTC
            why = f"columns of {', '.join(retyped)} retyped in place; {RETYPED_WHY}"
            read_whole_next(con, [e.name for e in entities], why)
        ops.record_schema(con, applied)


def _is_new(con: duckdb.DuckDBPyConnection) -> bool:
    """No table in the warehouse yet (a first sync's, or a test's)."""
    (tables,) = con.execute("SELECT count(*) FROM duckdb_tables() WHERE NOT internal").fetchone()
    return tables == 0


def history_tables_to_views(con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]) -> None:
    """Warehouses made before `history.<table>` became a view kept every version in it:
    the versions that are not the current one in clinical move to the superseded table."""
    for ent in entities:
        (is_table,) = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            [ddl.HISTORY, ent.table],
        ).fetchone()
        if not is_table:
            continue
        history = qualified(ddl.HISTORY, ent.table)
        key = quote(ent.key)
        con.execute(
            f"""CREATE TABLE {qualified(ddl.HISTORY, ddl.superseded_table(ent))} AS
                SELECT h.* FROM {history} AS h WHERE NOT EXISTS (
                    SELECT 1 FROM {qualified(ddl.CLINICAL, ent.table)} AS c
                    WHERE c.{key} = h.{key} AND c."_extracted_at" = h."_valid_from"
                      AND c."_content_hash" = h."_content_hash")"""
        )
        con.execute(f"DROP TABLE {history}")


def resolve_notes_loaded_since(
    con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]
) -> None:
    """Warehouses made before notes were resolved (`ops.rejects.resolved_at`): a note whose
    key a later extraction loaded (a version of it in clinical or the history, or a later
    note on a record that loaded) is resolved by the first such extraction, as a load now
    does. A reject of the old typing rule, whose record the re-read after the migration
    loaded, is one."""
    for ent in entities:
        key = quote(ent.key)
        ledger.resolve_notes(
            con,
            ent.name,
            f"""SELECT CAST({key} AS VARCHAR) AS "key", "_extracted_at" AS "extracted_at",
                       "_run_id" AS "run_id" FROM {qualified(ddl.CLINICAL, ent.table)}
                UNION ALL
                SELECT CAST({key} AS VARCHAR), "_valid_from", "_run_id"
                FROM {qualified(ddl.HISTORY, ddl.superseded_table(ent))}
                UNION ALL
                SELECT "key", "extracted_at", "run_id" FROM "ops"."rejects"
                WHERE "entity" = ? AND "kind" <> ? AND "key" IS NOT NULL""",
            [ent.name, REJECT],
        )


def retype_columns(con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]) -> list[str]:
    """Columns an older DDL typed otherwise, cast in place where every value survives the
    cast (a number to its decimal text, DECIMAL(18,4) to DECIMAL(38,12), a TIMESTAMPTZ to its
    text in UTC); the content hash of every version is computed again over the new types,
    as a load of the same batches now computes it, so a record read again unchanged is not a
    new version. Returns the entity sets whose tables changed."""
    found = {
        (schema, table, column): kind
        for schema, table, column, kind in con.execute(
            "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE schema_name IN (?, ?, ?)",
            [ddl.CLINICAL, ddl.HISTORY, ddl.OPS],
        ).fetchall()
    }
    names: dict[str, str] = {}  # declared type -> DuckDB's name for it

    def differs(place: tuple[str, str, str], declared: str) -> bool:
        if place not in found:
            return False  # a new column: the DDL adds it
        if declared not in names:
            (names[declared],) = con.execute(f"SELECT typeof(CAST(NULL AS {declared}))").fetchone()
        return found[place] != names[declared]

    retyped: list[str] = []
    for ent in entities:
        tables = (
            (ddl.CLINICAL, ent.table, ddl.clinical_columns(ent)),
            (ddl.HISTORY, ddl.superseded_table(ent), ddl.history_columns(ent)),
        )
        changed = False
        for schema, table, columns in tables:
            for column, (declared, _) in columns.items():
                if differs((schema, table, column), declared):
                    _alter(con, schema, table, column, declared)
                    changed = True
        if changed:
            content = column_list([*(f.name for f in ent.fields), EXTRAS])
            for schema, table, _ in tables:
                con.execute(
                    f"UPDATE {qualified(schema, table)} "
                    f'SET "_content_hash" = {CONTENT_HASH.format(content=content)}'
                )
            retyped.append(ent.name)
    for table, (_, columns) in ddl.OPS_TABLES.items():
        for column, (declared, _) in columns.items():
            if differs((ddl.OPS, table, column), declared):
                _alter(con, ddl.OPS, table, column, declared)
    return retyped


def _alter(con: duckdb.DuckDBPyConnection, schema: str, table: str, column: str, kind: str) -> None:
    con.execute(f"ALTER TABLE {qualified(schema, table)} ALTER {quote(column)} TYPE {kind}")


def read_whole_next(con: duckdb.DuckDBPyConnection, entities: Collection[str], why: str) -> None:
    """Mark sets to be read whole on the next run: no watermark (a set with a cursor starts
    over), no snapshot or rotation of key ranges (a nightly budget reads them first). One
    log line says which and why."""
    if not entities:
        return
    con.execute(
        'UPDATE "ops"."sync_state" SET "watermark" = NULL, "last_snapshot_at" = NULL, '
        '"covered_at" = NULL, "range_position" = NULL, "range_started_at" = NULL '
        'WHERE "entity" IN (SELECT unnest(?))',
        [list(entities)],
    )
    log.warning("read whole on the next run: %s (%s)", ", ".join(entities), why)
