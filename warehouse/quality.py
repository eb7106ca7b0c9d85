"""Data-quality SQL over the clinical tables: what the checks in the UI evaluate
(pipelines/checks.py wraps each figure in a Dagster check result)."""

from __future__ import annotations

import duckdb

from connectors.clinical_records.catalogue import EntitySet
from warehouse.ddl import CLINICAL
from warehouse.ident import qualified, quote


def duplicate_keys(con: duckdb.DuckDBPyConnection, entity: EntitySet) -> int:
    """Keys held more than once (live or soft-deleted): 0 after every load."""
    table, key = qualified(CLINICAL, entity.table), quote(entity.key)
    (dupes,) = con.execute(f"SELECT count(*) - count(DISTINCT {key}) FROM {table}").fetchone()
    return int(dupes)


def live_rows(con: duckdb.DuckDBPyConnection, entity: EntitySet) -> int:
    table = qualified(CLINICAL, entity.table)
    (rows,) = con.execute(f'SELECT count(*) FROM {table} WHERE "_deleted_at" IS NULL').fetchone()
    return int(rows)


def dangling(
    con: duckdb.DuckDBPyConnection,
    source: EntitySet,
    local: str,
    target: EntitySet,
    remote: str,
) -> tuple[int, int]:
    """(live rows of `source` with a `local` reference, those whose `target` row is missing
    or deleted); ids of another canonical type are compared as text."""
    left_field, right_field = source.field(local), target.field(remote)
    same_type = left_field.canonical is right_field.canonical
    left = f"s.{quote(local)}" if same_type else f"CAST(s.{quote(local)} AS VARCHAR)"
    right = f"t.{quote(remote)}" if same_type else f"CAST(t.{quote(remote)} AS VARCHAR)"
    source_table, target_table = (
        qualified(CLINICAL, source.table),
        qualified(CLINICAL, target.table),
    )
    row = con.execute(
        f"""SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM {target_table} AS t
                WHERE {right} = {left} AND t."_deleted_at" IS NULL))
            FROM {source_table} AS s
            WHERE s.{quote(local)} IS NOT NULL AND s."_deleted_at" IS NULL"""
    ).fetchone()
    return int(row[0]), int(row[1])
