"""`analytics.changes`: one row per record a load inserted, updated or deleted, written by the
merge in the load's own transaction (warehouse/merge.py), so that "what changed last night"
is a filter, never a self-join over validity windows, and exactly what the load did.

A run's rows carry its id and the load's time (`synced_at`, the `_synced_at` of the versions it
wrote). An update names the columns whose values moved (`_extras` among them when a value kept
as sent changed); a record that comes back after a deletion is inserted again.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from connectors.clinical_records.catalogue import EntitySet
from warehouse.ddl import ANALYTICS, CHANGES_TABLE
from warehouse.ident import qualified, quote
from warehouse.schema import EXTRAS

INSERTED, UPDATED, DELETED = "inserted", "updated", "deleted"
CHANGES = qualified(ANALYTICS, CHANGES_TABLE)


def _insert(select: str) -> str:
    """The statement that appends `select`'s rows (id, change, changed_columns)."""
    return (
        f"INSERT INTO {CHANGES} (run_id, entity, id, change, changed_columns, synced_at) "
        f"SELECT ?, ?, id, change, changed_columns, now() FROM ({select})"
    )


def record_plan(
    con: duckdb.DuckDBPyConnection,
    entity: EntitySet,
    run_id: str,
    replaced: str | None,
    actions: dict[str, str],
) -> None:
    """A merge's plan before it is applied (`_plan`: key and action, `_stage`: the new
    versions, `replaced`: the versions they replace, None when none does): the inserted keys,
    and the updated ones with the columns whose values differ from the version they replace.
    `actions` maps the plan's action names to a change."""
    key = quote(entity.key)
    moved = ", ".join(
        f"CASE WHEN s.{quote(c)} IS DISTINCT FROM c.{quote(c)} THEN '{c}' END"
        for c in [*(f.name for f in entity.fields), EXTRAS]
    )
    change = 'CASE p."_action" ' + " ".join(
        f"WHEN '{action}' THEN '{named}'" for action, named in actions.items()
    )
    con.execute(
        _insert(
            f"""SELECT CAST(p.{key} AS VARCHAR) AS id, {change} END AS change,
                    CASE WHEN {change} END = '{UPDATED}'
                         THEN list_filter([{moved}], lambda x: x IS NOT NULL) END AS changed_columns
                FROM "_plan" AS p
                JOIN "_stage" AS s ON s.rowid = p."_row_id"
                LEFT JOIN {replaced or "(SELECT * FROM _stage WHERE false)"} AS c
                       ON c.{key} = p.{key}
                WHERE p."_action" IN (SELECT unnest(?))"""
        ),
        [run_id, entity.name, list(actions)],
    )


def record_fresh(
    con: duckdb.DuckDBPyConnection, entity: EntitySet, run_id: str, files: Sequence[str]
) -> None:
    """A fresh load's keys, every one inserted (read from the batches' key column)."""
    con.execute(
        _insert(
            f"""SELECT CAST({quote(entity.key)} AS VARCHAR) AS id, '{INSERTED}' AS change,
                    NULL::VARCHAR[] AS changed_columns
                FROM read_parquet(?, hive_partitioning = false, union_by_name = true)"""
        ),
        [run_id, entity.name, list(files)],
    )


def record_keys(
    con: duckdb.DuckDBPyConnection,
    entity: EntitySet,
    run_id: str,
    change: str,
    keys: Sequence[object],
) -> None:
    """Keys a load inserted or deleted, as its statements returned them."""
    if keys:
        con.execute(
            _insert(
                "SELECT CAST(k AS VARCHAR) AS id, ? AS change, NULL::VARCHAR[] AS changed_columns "
                "FROM (SELECT unnest(?) AS k)"
            ),
            [run_id, entity.name, change, list(keys)],
        )


def one_per_record(con: duckdb.DuckDBPyConnection, entity: EntitySet, run_id: str) -> None:
    """A load that merged several versions of a key, one round each (warehouse/merge.py),
    recorded a change per round: one row per record stays, inserted when a round inserted it
    (it was absent or deleted before the load), else updated with every column that moved.
    This load's rows are those of its transaction (`synced_at`, now())."""
    columns = [*(f.name for f in entity.fields), EXTRAS]
    this_load = "run_id = ? AND entity = ? AND synced_at = now()"
    con.execute(
        f"""CREATE TEMP TABLE "_changed" AS
            SELECT id, CASE WHEN bool_or(change = '{INSERTED}') THEN '{INSERTED}'
                            ELSE '{UPDATED}' END AS change,
                   flatten(list(changed_columns)) AS moved
            FROM {CHANGES} WHERE {this_load} GROUP BY id HAVING count(*) > 1""",
        [run_id, entity.name],
    )
    con.execute(
        f'DELETE FROM {CHANGES} WHERE {this_load} AND id IN (SELECT id FROM "_changed")',
        [run_id, entity.name],
    )
    con.execute(
        _insert(
            f"""SELECT id, change, CASE WHEN change = '{UPDATED}' THEN
                    list_filter(?::VARCHAR[], lambda c: list_contains(moved, c)) END
                    AS changed_columns
                FROM "_changed" """
        ),
        [run_id, entity.name, columns],
    )
    con.execute('DROP TABLE "_changed"')
