"""DDL for every warehouse schema, generated from the catalogue (docs/ARCHITECTURE.md,
Warehouse schemas).

Each statement is idempotent (`IF NOT EXISTS`, `OR REPLACE`), so `ensure_schema` may run on
every start. Every table, view and column gets a `COMMENT ON` from the spec's meaning or the
column's purpose.

`history.<table>` is a view: the versions a newer one replaced live in
`history.<table>_superseded`, and the current version of every record is its row in
`clinical`. Storing the current versions once halves what a load writes (an initial load
wrote every row twice), and the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from connectors.clinical_records.catalogue import DOCUMENTS, EntitySet
from warehouse.ident import column_list, literal, qualified, quote
from warehouse.schema import CLINICAL_META, EXTRAS, HISTORY_META

SUPERSEDED = "_superseded"
AS_OF = "_as_of"  # history.<table>_as_of(ts), a table macro per set
CONTENT_META = (EXTRAS, "_content_hash")  # stored alike in clinical and history

CLINICAL, HISTORY, OPS, ANALYTICS = "clinical", "history", "ops", "analytics"
SCHEMAS: dict[str, str] = {
    CLINICAL: "Current state of every entity set, one row per record, soft deletes marked",
    HISTORY: "Type-2 history: every version of every record the syncs have seen",
    OPS: "Sync bookkeeping: watermarks, runs and how each set ended, rejected rows, loaded "
    "batches, source",
    ANALYTICS: "For analysts: the dbt models' tables, built from clinical after every run's loads "
    "(deleted rows excluded); what each run changed (changes); how each set's last run ended "
    "(sync_health) and how fresh each model is (model_health)",
}

# ops tables: name -> (meaning, {column: (DuckDB type, meaning)}).
Columns = dict[str, tuple[str, str]]
OPS_TABLES: dict[str, tuple[str, Columns]] = {
    "schema_version": (
        "The DDL last applied, so a load skips re-applying an unchanged schema",
        {
            "fingerprint": ("VARCHAR", "SHA-256 of every DDL statement, in order"),
            "applied_at": ("TIMESTAMPTZ", "When that DDL was applied"),
        },
    ),
    "sync_state": (
        "Per entity set: the watermark, written in the same transaction as the rows it covers",
        {
            "entity": ("VARCHAR", "Entity set name as the spec writes it"),
            "watermark": ("VARCHAR", "Cursor value the next incremental run starts from"),
            "last_run_id": ("VARCHAR", "Run of the last load"),
            "last_loaded_at": ("TIMESTAMPTZ", "When the last load committed"),
            "last_extracted_at": ("TIMESTAMPTZ", "Extraction time of the newest loaded batch"),
            "last_snapshot_at": ("TIMESTAMPTZ", "Extraction time of the last full snapshot"),
            "range_position": (
                "VARCHAR",
                "Under a nightly budget: the key the next key range read starts from (null: "
                "the first key)",
            ),
            "range_started_at": ("TIMESTAMPTZ", "When the current rotation of key ranges began"),
            "range_read_at": ("TIMESTAMPTZ", "Extraction time of the last key range read"),
            "covered_at": (
                "TIMESTAMPTZ",
                "Under a nightly budget: when the last completed rotation of key ranges "
                "began (every record read since); staleness counts from it or the last "
                "snapshot, whichever is later",
            ),
        },
    ),
    "sync_runs": (
        "One row per run, written once from how it ended (by the run's last step, or by whoever "
        "found it failed or killed): when, what, how it ended and what it loaded; a run still "
        "going has none yet (its loads are in ops.set_results)",
        {
            "run_id": ("VARCHAR", "Run identifier (Dagster's)"),
            "started_at": ("TIMESTAMPTZ", "When the run started (Dagster's run start)"),
            "finished_at": (
                "TIMESTAMPTZ",
                "When it ended: its last step; for a run found killed, its last event",
            ),
            "status": (
                "VARCHAR",
                "success (it finished), failed, killed (its process ended without finishing), "
                "rebuilt (a rebuild's own row) or unknown (a run a rebuild found in the lake's "
                "batches alone, until its ending is found)",
            ),
            "entities": ("VARCHAR[]", "Entity sets the run was asked for and those it loaded"),
            "full_snapshot": ("BOOLEAN", "The run asked for full snapshots"),
            "fetched": ("BIGINT", "Records read from the lake batches"),
            "inserted": ("BIGINT", "New records"),
            "updated": ("BIGINT", "Records whose content changed"),
            "soft_deleted": ("BIGINT", "Records a snapshot no longer contained"),
            "rejected": ("BIGINT", "Rows set aside in ops.rejects"),
            "message": ("VARCHAR", "Error summary of a failed run (no PHI)"),
            "reconciled": (
                "BIGINT",
                "Records written or deleted at the source while the run read it, found by "
                "reconciliation (re-read by cursor, found in key ranges, found deleted)",
            ),
            "reconcile_requests": ("BIGINT", "Requests reconciliation spent, over the reads"),
            "max_staleness_hours": (
                "DOUBLE",
                "After the run, the longest any of its sets without updated_at had gone "
                "unread whole, in hours (0: all read whole; a nightly budget reads the "
                "stalest first)",
            ),
            "unreconciled": (
                "BIGINT",
                "Records by which a set's count still differed from the source when the "
                "reconciliation budget ran out (0: every set ended equal to the source)",
            ),
            "exact": (
                "BOOLEAN",
                "The run finished and every set it loaded ended equal to the source by its own "
                "checks (no check of severity ERROR failed; ops.set_results says which did); "
                "false for a failed or killed run, null for a rebuild's own row",
            ),
        },
    ),
    "set_results": (
        "One row per run and entity set: how the set ended, recorded by its load with its "
        "figures, and every check of it as the check was evaluated (`clinical-sync status` "
        "and analytics.sync_health read it)",
        {
            "run_id": ("VARCHAR", "Run that loaded the set"),
            "entity": ("VARCHAR", "Entity set name as the spec writes it"),
            "recorded_at": ("TIMESTAMPTZ", "When the set's load and checks finished"),
            "mode": ("VARCHAR", "What the run read: snapshot, incremental, range, backfill, skip"),
            "exact": (
                "BOOLEAN",
                "The set ended equal to the source by its own checks: none of severity ERROR "
                "failed",
            ),
            "unreconciled": (
                "BIGINT",
                "Records by which the set differs from the source after the run, at least "
                "(what reconciliation could not settle within its budget; 0 when it settled "
                "all): a count's difference, which inserts and deletes may hide in part",
            ),
            "failed_checks": ("VARCHAR[]", "Checks of severity ERROR that failed"),
            "warned_checks": ("VARCHAR[]", "Checks of severity WARN that failed (warned)"),
            "staleness_hours": (
                "DOUBLE",
                "For a set without updated_at: hours since every record of it was last read "
                "(-1: never read whole); null for the sets whose updates every run reads",
            ),
            "live_rows": ("BIGINT", "Rows of the set not soft-deleted after the load"),
            "fetched": ("BIGINT", "Records the load read from the lake batches"),
            "inserted": ("BIGINT", "New records"),
            "updated": ("BIGINT", "Records whose content changed"),
            "soft_deleted": ("BIGINT", "Records a snapshot no longer contained"),
            "rejected": ("BIGINT", "Rows set aside in ops.rejects"),
            "reconciled": (
                "BIGINT",
                "Records written or deleted at the source while the run read the set, found by "
                "reconciliation",
            ),
            "reconcile_requests": ("BIGINT", "Requests reconciliation spent on the set"),
        },
    ),
    "rejects": (
        "Notes on records as sent: rejected (kind reject: no usable key), loaded with values "
        "kept raw (kind unfit) or loaded with a note (kind warning); kept when a later read "
        "loads the key, marked resolved",
        {
            "entity": ("VARCHAR", "Entity set name"),
            "key": ("VARCHAR", "Record key as sent, when known"),
            "kind": (
                "VARCHAR",
                "reject: row not loaded (no usable key); unfit: row loaded, the fields named "
                "null (a date-time finer than a microsecond: cut) and their values as sent in "
                "_extras; warning: row loaded as sent, note only",
            ),
            "fields": ("VARCHAR[]", "Fields at fault (unfit: the fields kept raw)"),
            "reason": ("VARCHAR", "Why, per field"),
            "raw_json": ("JSON", "The record exactly as the API sent it"),
            "run_id": ("VARCHAR", "Run that extracted the record"),
            "batch_id": ("VARCHAR", "Lake batch the reject belongs to"),
            "extracted_at": ("TIMESTAMPTZ", "Extraction time of that batch"),
            "resolved_at": (
                "TIMESTAMPTZ",
                "Extraction time of the first later batch that loaded the same key (the source "
                "sent the record again, usable): the note is history. Null while it is the "
                "latest word on its key; status counts only those",
            ),
            "resolved_run_id": ("VARCHAR", "Run that extracted that batch"),
        },
    ),
    "models": (
        "The dbt models' tables in analytics as last built and last failed, so that a model "
        "older than the tables it reads says so (analytics.model_health)",
        {
            "name": ("VARCHAR", "Model: the table analytics.<name>"),
            "fingerprint": ("VARCHAR", "dbt's checksum of the model's SQL as last built"),
            "built_at": ("TIMESTAMPTZ", "When the table was last built"),
            "rows": ("BIGINT", "Rows built"),
            "reads": ("VARCHAR[]", "Entity sets whose clinical tables it reads"),
            "built_run_id": ("VARCHAR", "Run that last built it"),
            "failed_at": ("TIMESTAMPTZ", "When its build or a test of severity error last failed"),
            "failed_run_id": ("VARCHAR", "Run of that failure"),
            "failure": (
                "VARCHAR",
                "What failed: the build (with DuckDB's kind of error) or the tests named",
            ),
        },
    ),
    "loaded_batches": (
        "Every lake batch file loaded, so a reload is recognised",
        {
            "batch_id": ("VARCHAR", "Lake batch identifier"),
            "entity": ("VARCHAR", "Entity set name"),
            "file": ("VARCHAR", "Path relative to the lake root"),
            "run_id": ("VARCHAR", "Run that extracted the batch"),
            "extracted_at": ("TIMESTAMPTZ", "Extraction time of the batch"),
            "rows": ("BIGINT", "Normalised rows in the batch"),
            "rejects": ("BIGINT", "Rejects and warnings of the batch"),
            "loaded_at": ("TIMESTAMPTZ", "When the batch was first loaded"),
        },
    ),
    "snapshots": (
        "Every full snapshot loaded, so a record first loaded after a snapshot that missed it "
        "is loaded deleted",
        {
            "entity": ("VARCHAR", "Entity set name"),
            "run_id": ("VARCHAR", "Run that extracted the snapshot"),
            "snapshot_at": ("TIMESTAMPTZ", "Extraction time of the snapshot"),
            "loaded_at": ("TIMESTAMPTZ", "When the snapshot was loaded"),
        },
    ),
    "document_content": (
        "Document content held in the content store under <LAKE_ROOT>/_documents",
        {
            "document_id": ("VARCHAR", "Document id (clinical.patient_documents.id)"),
            "patient_id": (DOCUMENTS.field("patient_id").canonical.value, "Owning patient"),
            "sha256": ("VARCHAR", "sha256 of the content: its file is sha256/<first 2>/<sha256>"),
            "size": ("BIGINT", "Bytes held, equal to file_size_bytes of the metadata"),
            "content_type": ("VARCHAR", "MIME type the metadata states"),
            "stored_at": ("TIMESTAMPTZ", "When the content was stored"),
            "run_id": ("VARCHAR", "Run that downloaded it"),
        },
    ),
    "source": (
        "The service the warehouse was built from; a sync from another source is refused",
        {
            "base_url": ("VARCHAR", "CLINICAL_API_BASE_URL of the first sync"),
            "customer": ("VARCHAR", "CLINICAL_CUSTOMER of the first sync"),
            "recorded_at": ("TIMESTAMPTZ", "When the source was recorded"),
        },
    ),
}


def field_columns(entity: EntitySet) -> Columns:
    """Catalogue fields in their canonical DuckDB types, with the spec's meanings."""
    return {f.name: (f.canonical.value, f.meaning) for f in entity.fields}


def clinical_columns(entity: EntitySet) -> Columns:
    return {**field_columns(entity), **CLINICAL_META}


def history_columns(entity: EntitySet) -> Columns:
    return {**field_columns(entity), **HISTORY_META}


def superseded_table(entity: EntitySet) -> str:
    """The table behind `history.<table>` that holds the replaced versions."""
    return f"{entity.table}{SUPERSEDED}"


def _comments(kind: str, target: str, meaning: str, columns: Columns) -> Iterator[str]:
    yield f"COMMENT ON {kind} {target} IS {literal(meaning)}"
    for col, (_, text) in columns.items():
        yield f"COMMENT ON COLUMN {target}.{quote(col)} IS {literal(text)}"


def _table(
    schema: str, name: str, meaning: str, columns: Columns, *, upgrades: bool = True
) -> Iterator[str]:
    target = qualified(schema, name)
    body = ",\n  ".join(f"{quote(col)} {kind}" for col, (kind, _) in columns.items())
    yield f"CREATE TABLE IF NOT EXISTS {target} (\n  {body}\n)"
    # A table made by an older catalogue gains the fields added since (adding a field is a line).
    for col, (kind, _) in columns.items() if upgrades else ():
        yield f"ALTER TABLE {target} ADD COLUMN IF NOT EXISTS {quote(col)} {kind}"
    yield from _comments("TABLE", target, meaning, columns)


def as_of_macro(entity: EntitySet) -> str:
    """The name of `history.<table>_as_of(ts)`."""
    return f"{entity.table}{AS_OF}"


def _as_of(entity: EntitySet) -> Iterator[str]:
    """`history.<table>_as_of(ts)`: the set as the warehouse held it at `ts`, each record's
    version valid then (seen at or before `ts`, not yet replaced or deleted)."""
    columns = column_list([*field_columns(entity), EXTRAS, "_run_id", "_valid_from", "_valid_to"])
    at = "CAST(ts AS TIMESTAMPTZ)"
    yield f"""CREATE OR REPLACE MACRO {qualified(HISTORY, as_of_macro(entity))}(ts) AS TABLE
SELECT {columns} FROM {qualified(HISTORY, entity.table)}
WHERE "_valid_from" <= {at} AND ("_valid_to" IS NULL OR "_valid_to" > {at})"""


def _history_view(entity: EntitySet, meaning: str) -> Iterator[str]:
    """`history.<table>`: the superseded versions and, from clinical, the current ones."""
    columns = history_columns(entity)
    content = column_list([*field_columns(entity), *CONTENT_META])
    target = qualified(HISTORY, entity.table)
    yield f"""CREATE OR REPLACE VIEW {target} AS
SELECT {column_list(columns)} FROM {qualified(HISTORY, superseded_table(entity))}
UNION ALL
SELECT {content}, "_extracted_at" AS "_valid_from", "_deleted_at" AS "_valid_to", "_run_id"
FROM {qualified(CLINICAL, entity.table)}"""
    yield from _comments("VIEW", target, meaning, columns)


def statements(entities: Iterable[EntitySet], *, upgrades: bool = True) -> Iterator[str]:
    """Every DDL statement of the warehouse, in an order DuckDB accepts. `upgrades=False`:
    without the ALTERs that bring a table made by an older catalogue up to date, for a new
    warehouse (two in five statements, a third of a new warehouse's DDL time)."""
    for schema in SCHEMAS:
        yield f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}"
    for entity in entities:
        what = f"{entity.name} ({entity.qualified_type})"
        yield from _table(
            CLINICAL,
            entity.table,
            f"Current state of {what}, one row per {entity.key}",
            clinical_columns(entity),
            upgrades=upgrades,
        )
        yield from _table(
            HISTORY,
            superseded_table(entity),
            f"Versions of {what} that a newer version or a deletion replaced "
            f"(history.{entity.table} adds the current ones)",
            history_columns(entity),
            upgrades=upgrades,
        )
        yield from _history_view(entity, f"Every version of {what} seen")
        yield from _as_of(entity)
    for name, (meaning, columns) in OPS_TABLES.items():
        yield from _table(OPS, name, meaning, columns, upgrades=upgrades)
    yield from _table(ANALYTICS, CHANGES_TABLE, CHANGES_MEANING, CHANGES_COLUMNS, upgrades=upgrades)
    for name, (meaning, sql) in ANALYTICS_VIEWS.items():
        yield sql
        yield f"COMMENT ON VIEW {qualified(ANALYTICS, name)} IS {literal(meaning)}"


# How each set's last run ended: a view over ops.set_results, so it is current the moment a
# result is recorded. `status` reads it too (runs.last_set_results).
SYNC_HEALTH_VIEW = "sync_health"
SYNC_HEALTH_MEANING = (
    "How each entity set's last run ended: exact when none of its checks of severity ERROR "
    "failed, else the records by which it may differ (unreconciled) and the checks that failed"
)
SYNC_HEALTH = f"""CREATE OR REPLACE VIEW {qualified(ANALYTICS, SYNC_HEALTH_VIEW)} AS
SELECT r.entity, r.exact, r.unreconciled, r.failed_checks, r.warned_checks,
    r.staleness_hours, r.live_rows, r.mode, r.run_id, r.recorded_at
FROM {qualified(OPS, "set_results")} AS r
QUALIFY row_number() OVER (PARTITION BY r.entity ORDER BY r.recorded_at DESC) = 1"""

# What each run inserted, updated and deleted: written by the merge in the load's transaction
# (warehouse/changes.py); "last night" is the latest run's rows.
CHANGES_TABLE = "changes"
CHANGES_MEANING = (
    "One row per record a run inserted, updated or deleted (documents included), written by "
    "the load that did it; the latest run's rows are what changed last night"
)
CHANGES_COLUMNS: Columns = {
    "run_id": ("VARCHAR", "Run whose load changed the record"),
    "entity": ("VARCHAR", "Entity set name as the spec writes it"),
    "id": ("VARCHAR", "The record's key as sent (a number as its decimal text)"),
    "change": (
        "VARCHAR",
        "inserted, updated or deleted (a record back after a deletion: inserted)",
    ),
    "changed_columns": (
        "VARCHAR[]",
        "For an update, the columns whose values moved (_extras when a value kept as sent did)",
    ),
    "synced_at": ("TIMESTAMPTZ", "When the load committed it (the version's _synced_at)"),
}

# Each dbt model's table, how fresh: stale when a table it reads changed after it was built
# (its build failed, or the run that loaded the table did not build it).
MODEL_HEALTH_VIEW = "model_health"
MODEL_HEALTH_MEANING = (
    "Each dbt model's table in analytics: when it was built, and stale when a clinical table "
    "it reads changed since (changed_since_built names them); its last failure"
)
MODEL_HEALTH = f"""CREATE OR REPLACE VIEW {qualified(ANALYTICS, MODEL_HEALTH_VIEW)} AS
WITH changed AS (
    SELECT entity, max(synced_at) AS changed_at
    FROM {qualified(ANALYTICS, CHANGES_TABLE)} GROUP BY entity
),
since AS (
    SELECT m.name, list(c.entity ORDER BY c.entity) AS entities
    FROM {qualified(OPS, "models")} AS m
    JOIN changed AS c ON list_contains(m.reads, c.entity) AND c.changed_at > m.built_at
    GROUP BY m.name
)
SELECT m.name, m.built_at, m.built_run_id, m.rows,
    m.built_at IS NULL OR s.name IS NOT NULL AS stale,
    coalesce(s.entities, []) AS changed_since_built,
    m.reads, m.failed_at, m.failed_run_id, m.failure
FROM {qualified(OPS, "models")} AS m
LEFT JOIN since AS s ON s.name = m.name"""

# The analytics objects the DDL owns (dbt owns the models' tables).
ANALYTICS_VIEWS: dict[str, tuple[str, str]] = {
    SYNC_HEALTH_VIEW: (SYNC_HEALTH_MEANING, SYNC_HEALTH),
    MODEL_HEALTH_VIEW: (MODEL_HEALTH_MEANING, MODEL_HEALTH),
}
DDL_OWNED = frozenset({*ANALYTICS_VIEWS, CHANGES_TABLE})


def ops_table(name: str) -> Iterator[str]:
    """One ops table's statements (its schema first), for a caller that needs it alone."""
    meaning, columns = OPS_TABLES[name]
    yield f"CREATE SCHEMA IF NOT EXISTS {quote(OPS)}"
    yield from _table(OPS, name, meaning, columns)
