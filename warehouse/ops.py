"""Every statement over the `ops` schema: runs, sync state, snapshots, batches, rejects,
source and schema version. The tables themselves are declared in `warehouse/ddl.py`.

Callers own the transaction (a load writes its state with its rows, `Warehouse.load`), but
for `fail_run`, which stands alone. `Warehouse` offers the run functions as its methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from datetime import datetime
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import DOCUMENTS, EntitySet
from warehouse.connection import Transaction
from warehouse.ddl import ANALYTICS, CLINICAL, OPS, SYNC_HEALTH_VIEW
from warehouse.figures import RECONCILE_FIGURES, Figure
from warehouse.ident import qualified, quote
from warehouse.lake import BatchInfo
from warehouse.normalise import REJECT, UNFIT

SUCCESS, FAILED = "success", "failed"  # ops.sync_runs statuses
RUN_FIGURES = ("fetched", "inserted", "updated", "soft_deleted", "rejected")  # summed per run


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


@dataclass(frozen=True)
class SetResult:
    """How one entity set ended in one run, as its load's checks found it."""

    entity: str
    mode: str
    live_rows: int
    unreconciled: int  # records by which the set may differ from the source
    failed_checks: tuple[str, ...] = ()  # severity ERROR
    warned_checks: tuple[str, ...] = ()  # severity WARN
    staleness_hours: float | None = None  # sets without updated_at only
    run_id: str = ""
    recorded_at: datetime | None = None

    @property
    def exact(self) -> bool:
        """Equal to the source by its own checks: no check of severity ERROR failed."""
        return not self.failed_checks


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


# -- source --------------------------------------------------------------------------------


def source(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """The (base_url, customer) the warehouse was built from; None before the first load."""
    row = con.execute('SELECT "base_url", "customer" FROM "ops"."source"').fetchone()
    return (row[0], row[1]) if row else None


def record_source(con: duckdb.DuckDBPyConnection, base_url: str, customer: str) -> None:
    con.execute('DELETE FROM "ops"."source"')
    con.execute('INSERT INTO "ops"."source" VALUES (?, ?, now())', [base_url, customer])


# -- runs ----------------------------------------------------------------------------------


def record_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: Iterable[str],
    *,
    full_snapshot: bool = False,
    started_at: datetime | None = None,
) -> None:
    """The run's row; `started_at` is when the run began (default: now)."""
    con.execute(
        'INSERT INTO "ops"."sync_runs" ("run_id", "started_at", "status", "entities", '
        '"full_snapshot") VALUES (?, coalesce(?, now()), ?, ?, ?)',
        [run_id, started_at, "running", list(entities), full_snapshot],
    )


def finish_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    status: str,
    results: Mapping[str, LoadResult] | None = None,
    message: str | None = None,
) -> None:
    total = sum((results or {}).values(), LoadResult())
    figures = ", ".join(f"{quote(name)} = ?" for name in RUN_FIGURES)
    con.execute(
        f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
        '"message" = ? WHERE "run_id" = ?',
        [status, *(getattr(total, name) for name in RUN_FIGURES), message, run_id],
    )


def add_to_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: Iterable[str],
    result: LoadResult,
    *,
    full_snapshot: bool = False,
    reconciled: Mapping[str, int] | None = None,
    staleness_hours: float = 0.0,
    started_at: datetime | None = None,
) -> None:
    """Add a committed load's figures (and its extraction's `reconciled` figures, named
    as RECONCILE_FIGURES, and how stale its set is) to its run's row, created by the
    run's first load (`started_at`: when the run began, not that load); a run of several
    loads (entity sets, documents) keeps one row that names them all."""
    _ensure_run(con, run_id, list(entities), full_snapshot, started_at)
    names = (*RUN_FIGURES, *RECONCILE_FIGURES)
    figures = ", ".join(f"{quote(name)} = coalesce({quote(name)}, 0) + ?" for name in names)
    extra = reconciled or {}
    con.execute(
        f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
        '"max_staleness_hours" = greatest(coalesce("max_staleness_hours", 0), ?), '
        '"message" = NULL WHERE "run_id" = ?',
        [
            SUCCESS,
            *(getattr(result, name) for name in RUN_FIGURES),
            *(int(extra.get(name, 0)) for name in RECONCILE_FIGURES),
            float(staleness_hours),
            run_id,
        ],
    )


def fail_run(
    con: duckdb.DuckDBPyConnection, run_id: str, message: str, started_at: datetime | None = None
) -> None:
    """Mark a run failed (and so not exact), keeping what its finished loads recorded; a run
    that failed before its first load gets a row of its own. One transaction of its own."""
    with Transaction(con):
        _ensure_run(con, run_id, [], started_at=started_at)
        con.execute(
            'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, "message" = ?, '
            '"exact" = false WHERE "run_id" = ?',
            [FAILED, message, run_id],
        )


SET_RESULT_COLUMNS = (
    "run_id",
    "entity",
    "mode",
    "exact",
    Figure.UNRECONCILED,
    "failed_checks",
    "warned_checks",
    "staleness_hours",
    Figure.LIVE_ROWS,
)


def record_set_result(con: duckdb.DuckDBPyConnection, run_id: str, result: SetResult) -> None:
    """How a set ended in `run_id`, replacing what an earlier attempt of the same step
    recorded; the run is exact while each of its sets is. The caller owns the transaction
    (the load step's figures and this commit together)."""
    con.execute(
        'DELETE FROM "ops"."set_results" WHERE "run_id" = ? AND "entity" = ?',
        [run_id, result.entity],
    )
    values = {
        **{name: getattr(result, name) for name in SET_RESULT_COLUMNS if name != "run_id"},
        "run_id": run_id,
        "failed_checks": list(result.failed_checks),
        "warned_checks": list(result.warned_checks),
    }
    names = ", ".join(quote(name) for name in SET_RESULT_COLUMNS)
    marks = ", ".join("?" for _ in SET_RESULT_COLUMNS)
    con.execute(
        f'INSERT INTO "ops"."set_results" ({names}, "recorded_at") VALUES ({marks}, now())',
        [values[name] for name in SET_RESULT_COLUMNS],
    )
    con.execute(
        'UPDATE "ops"."sync_runs" SET "exact" = NOT EXISTS (SELECT 1 FROM "ops"."set_results" '
        'WHERE "run_id" = ? AND NOT "exact") WHERE "run_id" = ? AND "status" <> ?',
        [run_id, run_id, FAILED],
    )


def mark_unsettled(
    con: duckdb.DuckDBPyConnection, run_id: str, entity: str, later: int, check: str
) -> None:
    """A set the run's end found touched after its last look, and could not look at again:
    not exact, by at least one record, `check` among its failed checks; the run with it."""
    con.execute(
        'UPDATE "ops"."set_results" SET "unreconciled" = greatest("unreconciled", 1), '
        '"failed_checks" = list_distinct(list_append("failed_checks", ?)), "exact" = false '
        'WHERE "run_id" = ? AND "entity" = ?',
        [check, run_id, entity],
    )
    con.execute(
        'UPDATE "ops"."sync_runs" SET "exact" = false WHERE "run_id" = ?',
        [run_id],
    )


def last_set_results(con: duckdb.DuckDBPyConnection) -> dict[str, SetResult]:
    """Per entity set, how its last recorded run ended: read from `analytics.sync_health`,
    so `status` and the analysts' view say the same; empty for a warehouse made before
    results were recorded."""
    names = [f.name for f in fields(SetResult)]
    try:
        rows = con.execute(
            f"SELECT {', '.join(quote(name) for name in names)} "
            f"FROM {qualified(ANALYTICS, SYNC_HEALTH_VIEW)}"
        ).fetchall()
    except duckdb.CatalogException:
        return {}
    found = {}
    for row in rows:
        values = dict(zip(names, row, strict=True))
        values["failed_checks"] = tuple(values["failed_checks"] or ())
        values["warned_checks"] = tuple(values["warned_checks"] or ())
        found[values["entity"]] = SetResult(**values)
    return found


def _ensure_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: list[str],
    full_snapshot: bool = False,
    started_at: datetime | None = None,
) -> None:
    """The run's row, made by the first write of the run; later writes add the sets it
    does not name yet."""
    row = con.execute(
        'SELECT "entities" FROM "ops"."sync_runs" WHERE "run_id" = ?', [run_id]
    ).fetchone()
    if row is None:
        record_run(con, run_id, entities, full_snapshot=full_snapshot, started_at=started_at)
    elif missing := [name for name in entities if name not in row[0]]:
        con.execute(
            'UPDATE "ops"."sync_runs" SET "entities" = ? WHERE "run_id" = ?',
            [[*row[0], *missing], run_id],
        )


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


def rejected_keys(con: duckdb.DuckDBPyConnection, entity: str, kind: str) -> list[Any]:
    """Keys the source sent that were set aside as `kind` (in its count, not in the table)
    and that no later read has loaded."""
    rows = con.execute(
        'SELECT DISTINCT "key" FROM "ops"."rejects" WHERE "entity" = ? AND "kind" = ? '
        'AND "key" IS NOT NULL AND "resolved_at" IS NULL',
        [entity, kind],
    ).fetchall()
    return [k for (k,) in rows]


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


# -- what a merge reads and records --------------------------------------------------------


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


def first_snapshot_missing(key: str) -> str:
    """SQL of when the first snapshot extracted at or after a staged version (`s`) missed
    its key (quoted `key`), NULL when none did; its one parameter is the entity set. A
    snapshot that rejected the key did not miss it."""
    return f"""(SELECT min(n."snapshot_at") FROM "ops"."snapshots" AS n
                WHERE n."entity" = ? AND n."snapshot_at" >= s."_extracted_at"
                  AND NOT EXISTS (
                    SELECT 1 FROM "ops"."rejects" AS r
                    WHERE r."entity" = n."entity" AND r."run_id" = n."run_id"
                      AND r."key" = CAST(s.{key} AS VARCHAR)))"""


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
