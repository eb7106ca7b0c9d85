"""Applying the DDL: skipped while its fingerprint is unchanged, with the shims that bring
warehouses made by older versions up to date in the same transaction."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import duckdb

from connectors.clinical_records.catalogue import EntitySet
from warehouse import ddl, ops
from warehouse.connection import Transaction
from warehouse.ident import qualified, quote


def fingerprint(statements: Iterable[str]) -> str:
    """SHA-256 of the DDL statements, in order: what `ops.schema_version` remembers."""
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()


def ensure_schema(con: duckdb.DuckDBPyConnection, entities: Iterable[EntitySet]) -> None:
    """Create (or extend) every schema, table and comment; safe to run on every start.

    Skipped when the DDL's fingerprint is the one last applied: every load step calls
    this, and re-running a few hundred statements cost half a second each time."""
    entities = list(entities)
    statements = list(ddl.statements(entities))
    applied = fingerprint(statements)
    if ops.applied_schema(con) == applied:
        return
    with Transaction(con):
        history_tables_to_views(con, entities)
        for statement in statements:
            con.execute(statement)
        ops.seed_snapshots(con)
        ops.record_schema(con, applied)


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
