"""A load's soft deletes: the records a snapshot did not see, and the keys an extraction found
gone at the source (its deletes side files). A deleted record keeps its row in `clinical`,
marked `_deleted_at` (the instant it went), and is recorded in `analytics.changes`.

Both mark a record as of the first deletion extracted at or after the version held: a later
snapshot's or deletion's mark (its load committed first) moves back to it, as a replay in
extraction order would leave it. The merge (`warehouse/merge.py`) calls them in its
transaction, after its versions are applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

import duckdb
import pyarrow as pa

from connectors.clinical_records.catalogue import EntitySet
from warehouse import changes
from warehouse.lake import DELETES, BatchInfo, Lake, side_path


class Merge(Protocol):
    """What the soft deletes read of a load's merge (`warehouse.merge.Merge`), named here so
    that this module never imports the one that calls it."""

    con: duckdb.DuckDBPyConnection
    ent: EntitySet
    run_id: str
    clinical: str  # the qualified clinical table
    key: str  # its quoted key column
    paths: Sequence[Path]
    infos: Sequence[BatchInfo]
    snapshot_at: datetime

    def reject_files(self) -> list[str]: ...


def missed_by_snapshot(merge: Merge) -> int:
    """A snapshot marks what it did not see (nor reject) and was extracted before it; a
    later snapshot's mark (it committed first) moves back to it, as in extraction order.
    Reads `_keys`, the keys the snapshot's batches carried."""
    files = merge.reject_files()
    rejected_keys = (
        f"""AND CAST(c.{merge.key} AS VARCHAR) NOT IN (
                SELECT r."key" FROM read_parquet(?, union_by_name = true, hive_partitioning = false) AS r
                WHERE r."key" IS NOT NULL)"""
        if files
        else ""
    )
    merge.con.execute(
        f"""CREATE TEMP TABLE "_gone" AS
            SELECT c.rowid AS "row", ?::TIMESTAMPTZ AS "at" FROM {merge.clinical} AS c
            WHERE c."_extracted_at" <= ?
              AND NOT EXISTS (SELECT 1 FROM "_keys" AS s WHERE s.{merge.key} = c.{merge.key})
              {rejected_keys}""",
        [merge.snapshot_at, merge.snapshot_at, *([files] if files else [])],
    )
    return _mark(merge)


def found_gone(merge: Merge) -> int:
    """Mark deleted the keys an extraction found gone at the source, as of the first such
    batch extracted at or after the version held (an earlier deletion stays)."""
    found = [
        (str(side_path(Lake.root_of(p), DELETES, i.table, i.batch_id)), i.extracted)
        for p, i in zip(merge.paths, merge.infos, strict=True)
        if i.deletes
    ]
    if not found:
        return 0
    gone = pa.table(
        {
            "file": [f for f, _ in found],
            "at": pa.array([t for _, t in found], pa.timestamp("us", "UTC")),
        }
    )
    merge.con.register("_gone_files", gone)
    # The keys found gone, held, each with its first deletion: one join, its keys compared
    # in the table's type (a text cast of every key held would scan clinical whole) and
    # then as sent, so that "007" never deletes 7.
    kind = merge.ent.field(merge.ent.key).canonical.value
    merge.con.execute(
        f"""CREATE TEMP TABLE "_gone" AS
            SELECT h.rowid AS "row", min(f."at") AS "at"
            FROM read_parquet(?, filename = true, hive_partitioning = false) AS d
            JOIN "_gone_files" AS f ON d."filename" = f."file"
            JOIN {merge.clinical} AS h ON h.{merge.key} = TRY_CAST(d."key" AS {kind})
             AND CAST(h.{merge.key} AS VARCHAR) = d."key" AND h."_extracted_at" <= f."at"
            GROUP BY ALL""",
        [[f for f, _ in found]],
    )
    merge.con.unregister("_gone_files")
    return _mark(merge)


def _mark(merge: Merge) -> int:
    """Mark deleted the rows of `_gone` (clinical's row id, the instant it went): records
    deleted later move back to it (they were gone already), live ones are marked and
    recorded deleted in analytics.changes. How many it marked; drops `_gone`.

    The live keys are read before the update: an UPDATE with RETURNING reads and writes
    every column of the rows it returns, and took a second for a few hundred rows."""
    con = merge.con
    update = f"""UPDATE {merge.clinical} AS c SET "_deleted_at" = g."at" FROM "_gone" AS g
                 WHERE c.rowid = g."row" AND """
    (moved,) = con.execute(update + 'c."_deleted_at" > g."at"').fetchone()
    keys = con.execute(
        f"""SELECT c.{merge.key} FROM {merge.clinical} AS c JOIN "_gone" AS g
            ON c.rowid = g."row" WHERE c."_deleted_at" IS NULL"""
    ).fetchall()
    con.execute(update + 'c."_deleted_at" IS NULL')
    con.execute('DROP TABLE "_gone"')
    changes.record_keys(con, merge.ent, merge.run_id, changes.DELETED, [k for (k,) in keys])
    return moved + len(keys)
