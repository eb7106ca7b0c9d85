"""Whom a documents run lists, decided from what the warehouse knows (DESIGN.md, budget).

Listing costs one request per patient (spec 4.3). On the full-listing cadence (and on the
first run, or when asked) every live patient of `clinical.patients` and every patient we hold
documents of is listed whole. On ordinary nights only the patients whose rows changed in the
warehouse since the last run: `clinical.patients._synced_at` is set only when a row is
inserted, updated or resurrected, and the newest value seen is the documents' watermark in
`ops.sync_state`; they are listed from their newest `uploaded_at` held. Patients noted by
`clinical-sync documents` upload or delete are listed whole, so their deletions show at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import DOCUMENTS, PATIENTS
from warehouse.ddl import CLINICAL
from warehouse.ident import qualified
from warehouse.load import Warehouse

LOCK_WAIT_SECONDS = 120.0
DOCS_TABLE = qualified(CLINICAL, DOCUMENTS.table)
PATIENTS_TABLE = qualified(CLINICAL, PATIENTS.table)


# -- what the warehouse knows ---------------------------------------------------------------


@dataclass(frozen=True)
class DocumentsState:
    """What the warehouse says before a run: patients, their newest uploads, the last run."""

    live_patients: frozenset[str] = frozenset()
    changed_patients: frozenset[str] = frozenset()
    newest_upload: dict[str, datetime] = field(default_factory=dict)
    with_documents: frozenset[str] = frozenset()
    patients_mark: str | None = None  # newest clinical.patients._synced_at now
    last_full_at: datetime | None = None


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _fetch(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[tuple]:
    """Rows, or none when the table does not exist yet (a first run)."""
    try:
        return con.execute(sql, params).fetchall()
    except duckdb.CatalogException:
        return []


def read_state(con: duckdb.DuckDBPyConnection) -> DocumentsState:
    stored = _fetch(
        con,
        'SELECT "watermark", "last_snapshot_at" FROM "ops"."sync_state" WHERE "entity" = ?',
        [DOCUMENTS.name],
    )
    previous, last_full = stored[0] if stored else (None, None)
    patients = _fetch(
        con,
        f'SELECT CAST("id" AS VARCHAR), "_deleted_at" IS NULL, '
        f'? IS NULL OR "_synced_at" > CAST(? AS TIMESTAMPTZ) FROM {PATIENTS_TABLE}',
        [previous, previous],
    )
    mark = _fetch(con, f'SELECT max("_synced_at") FROM {PATIENTS_TABLE}', [])
    uploads = _fetch(
        con,
        f'SELECT CAST("patient_id" AS VARCHAR), max("uploaded_at"), '
        f'count(*) FILTER (WHERE "_deleted_at" IS NULL) FROM {DOCS_TABLE} GROUP BY 1',
        [],
    )
    newest = mark[0][0] if mark and mark[0][0] is not None else None
    return DocumentsState(
        live_patients=frozenset(p for p, live, _ in patients if live),
        changed_patients=frozenset(p for p, _, changed in patients if changed),
        newest_upload={p: _utc(at) for p, at, _ in uploads if at is not None},
        with_documents=frozenset(p for p, _, live in uploads if live),
        patients_mark=_utc(newest).isoformat() if newest is not None else previous,
        last_full_at=_utc(last_full),
    )


def load_state(warehouse_path: str | Path) -> DocumentsState:
    """The state from the DuckDB file, read-only (waits for a writer); empty before any sync."""
    if not Path(warehouse_path).exists():
        return DocumentsState()
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        return read_state(wh.con)


# -- the budget plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentsOptions:
    full: bool = False  # list every patient now, whatever the cadence
    full_every: timedelta = timedelta(days=7)
    download_content: bool = False


@dataclass(frozen=True)
class ListingPlan:
    """Whom to list: `whole` without a filter (absent documents are deleted), `since` from
    each patient's newest upload held. One request per patient (more past 100 documents)."""

    full: bool
    reason: str
    whole: tuple[str, ...]
    since: dict[str, datetime]
    patients_mark: str | None

    @property
    def patients(self) -> int:
        return len(self.whole) + len(self.since)

    @property
    def expected_requests(self) -> int:
        return self.patients

    def expected_seconds(self, rate: float) -> float:
        return self.expected_requests / rate if rate > 0 else 0.0


def plan_listing(
    state: DocumentsState,
    options: DocumentsOptions,
    noted: set[str],
    now: datetime | None = None,
) -> ListingPlan:
    """Decide whom this run lists (pure: tested without a server or a warehouse)."""
    now = now or datetime.now(UTC)
    due = state.last_full_at is None or now - state.last_full_at >= options.full_every
    if options.full or due:
        reason = (
            "full listing requested"
            if options.full
            else "first listing"
            if state.last_full_at is None
            else f"full listing due (every {options.full_every.days} days)"
        )
        everyone = state.live_patients | state.with_documents | noted
        return ListingPlan(True, reason, tuple(sorted(everyone)), {}, state.patients_mark)
    changed = state.changed_patients - noted
    since = {p: state.newest_upload[p] for p in changed if p in state.newest_upload}
    whole = noted | {p for p in changed if p not in state.newest_upload}
    reason = (
        f"{len(changed)} patients changed since the last run, "
        f"{len(noted)} noted by clinical-sync documents"
    )
    return ListingPlan(False, reason, tuple(sorted(whole)), since, state.patients_mark)
