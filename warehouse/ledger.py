"""What a merge reads and records in `ops`: the batch ledger (a batch loaded again is
recognised), the snapshots loaded, the notes on records (rejects, values kept raw, warnings)
and when a later read resolved them. `LoadResult`: what one load did. The merge
(`warehouse/merge.py`) owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import Any

import duckdb

from warehouse.normalise import REJECT, UNFIT


@dataclass(frozen=True)
class LoadResult:
    """What one load did; `fetched` counts every row the batches hold, rejects included."""

    fetched: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    soft_deleted: int = 0
    resurrected: int = 0
    rejected: int = 0

    def __add__(self, other: LoadResult) -> LoadResult:
        return LoadResult(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def seed_snapshots(con: duckdb.DuckDBPyConnection) -> None:
    """Warehouses made before `ops.snapshots` know their last snapshot only (from
    `sync_state`, its run from the batch ledger): it is the one recorded for them."""
    con.execute(
        """INSERT INTO "ops"."snapshots"
           SELECT s."entity",
                  (SELECT min(b."run_id") FROM "ops"."loaded_batches" AS b
                   WHERE b."entity" = s."entity" AND b."extracted_at" = s."last_snapshot_at"),
                  s."last_snapshot_at", now()
           FROM "ops"."sync_state" AS s
           WHERE s."last_snapshot_at" IS NOT NULL AND NOT EXISTS
                 (SELECT 1 FROM "ops"."snapshots" AS n WHERE n."entity" = s."entity")"""
    )


def rejected_keys(con: duckdb.DuckDBPyConnection, entity: str, kind: str) -> list[Any]:
    """Keys the source sent that were set aside as `kind` (in its count, not in the table)
    and that no later read has loaded."""
    rows = con.execute(
        'SELECT DISTINCT "key" FROM "ops"."rejects" WHERE "entity" = ? AND "kind" = ? '
        'AND "key" IS NOT NULL AND "resolved_at" IS NULL',
        [entity, kind],
    ).fetchall()
    return [k for (k,) in rows]


def run_rejects(con: duckdb.DuckDBPyConnection, entity: str, run_id: str) -> int:
    """Rows of `entity` that run `run_id` set aside (warnings not counted)."""
    (count,) = con.execute(
        'SELECT count(*) FROM "ops"."rejects" WHERE "entity" = ? AND "kind" = ? AND "run_id" = ?',
        [entity, REJECT, run_id],
    ).fetchone()
    return int(count)


def run_unfit(con: duckdb.DuckDBPyConnection, entity: str, run_id: str) -> dict[str, int]:
    """Per field, the records of `entity` that run `run_id` loaded with that field's value
    kept raw in `_extras` (it did not fit its column)."""
    rows = con.execute(
        'SELECT "field", count(*) FROM (SELECT unnest("fields") AS "field" FROM "ops"."rejects" '
        'WHERE "entity" = ? AND "kind" = ? AND "run_id" = ?) GROUP BY ALL ORDER BY ALL',
        [entity, UNFIT, run_id],
    ).fetchall()
    return dict(rows)


def loaded_batch_ids(con: duckdb.DuckDBPyConnection, ids: Sequence[str]) -> set[str]:
    """The batches among `ids` that a load committed before (a reload is recognised)."""
    rows = con.execute(
        'SELECT "batch_id" FROM "ops"."loaded_batches" WHERE "batch_id" IN (SELECT unnest(?))',
        [list(ids)],
    ).fetchall()
    return {row[0] for row in rows}


def snapshot_since(con: duckdb.DuckDBPyConnection, entity: str, extracted: datetime) -> bool:
    """Whether a snapshot loaded earlier was extracted at or after `extracted`."""
    (count,) = con.execute(
        'SELECT count(*) FROM "ops"."snapshots" WHERE "entity" = ? AND "snapshot_at" >= ?',
        [entity, extracted],
    ).fetchone()
    return count > 0


def record_snapshot(
    con: duckdb.DuckDBPyConnection, entity: str, run_id: str, snapshot_at: datetime
) -> None:
    con.execute(
        'INSERT INTO "ops"."snapshots" SELECT ?, ?, ?, now() WHERE NOT EXISTS '
        '(SELECT 1 FROM "ops"."snapshots" WHERE "entity" = ? AND "snapshot_at" = ?)',
        [entity, run_id, snapshot_at, entity, snapshot_at],
    )


def first_snapshot_missing(key: str, extracted: str) -> str:
    """SQL of when the first snapshot extracted at or after a version (extracted at the SQL
    `extracted`) missed its key (the SQL `key`), NULL when none did; its one parameter is the
    entity set. A snapshot that rejected the key did not miss it."""
    return f"""(SELECT min(n."snapshot_at") FROM "ops"."snapshots" AS n
                WHERE n."entity" = ? AND n."snapshot_at" >= {extracted}
                  AND NOT EXISTS (
                    SELECT 1 FROM "ops"."rejects" AS r
                    WHERE r."entity" = n."entity" AND r."run_id" = n."run_id"
                      AND r."key" = CAST({key} AS VARCHAR)))"""


def copy_new_rejects(con: duckdb.DuckDBPyConnection) -> None:
    """The staged `_rejects` of batches loaded for the first time into ops.rejects."""
    con.execute(
        """INSERT INTO "ops"."rejects" ("entity", "key", "kind", "fields", "reason", "raw_json",
                                        "run_id", "batch_id", "extracted_at")
           SELECT "entity", "key", "kind", "fields", "reason", "raw_json", "batch_run_id",
                  "batch_id", "extracted_at" FROM "_rejects" WHERE "new" """
    )


def _open_notes(con: duckdb.DuckDBPyConnection, entity: str) -> int:
    """Notes on keys of `entity` that no later read has resolved."""
    (count,) = con.execute(
        'SELECT count(*) FROM "ops"."rejects" WHERE "entity" = ? AND "key" IS NOT NULL '
        'AND "resolved_at" IS NULL',
        [entity],
    ).fetchone()
    return int(count)


def resolve_notes(
    con: duckdb.DuckDBPyConnection, entity: str, sent: str, params: Sequence[object] = ()
) -> None:
    """A note (reject, unfit, warning) is about its record as one batch sent it; when a
    later batch loads the same key, the note is history: marked resolved by the first such
    batch; the note stays. `sent`: a SELECT of the keys loaded (key as text, extracted_at,
    run_id), run with `params` only while notes are open (it may read every batch's keys)."""
    if not _open_notes(con, entity):
        return
    con.execute(f'CREATE TEMP TABLE "_sent" AS {sent}', list(params))
    con.execute(
        """UPDATE "ops"."rejects" AS r SET "resolved_at" = s."at", "resolved_run_id" = s."run"
            FROM (SELECT n.rowid AS "note", min(k."extracted_at") AS "at",
                         arg_min(k."run_id", k."extracted_at") AS "run"
                  FROM "ops"."rejects" AS n
                  JOIN "_sent" AS k ON k."key" = n."key" AND k."extracted_at" > n."extracted_at"
                  WHERE n."entity" = ? AND n."resolved_at" IS NULL
                  GROUP BY n.rowid) AS s
            WHERE r.rowid = s."note" """,
        [entity],
    )
    con.execute('DROP TABLE "_sent"')


def record_new_batches(con: duckdb.DuckDBPyConnection, entity: str) -> None:
    """The registered `_batches` loaded for the first time into the ledger."""
    con.execute(
        """INSERT INTO "ops"."loaded_batches"
           SELECT b."batch_id", ?, b."relative_file", b."batch_run_id", b."extracted_at",
                  b."rows", b."rejects", now()
           FROM "_batches" AS b WHERE b."new" """,
        [entity],
    )
