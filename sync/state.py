"""The committed sync state an extraction starts from, read from `ops.sync_state`.

Read-only and brief: an extraction may run while another step loads, so it waits for the
writer's lock instead of failing. No warehouse yet means a first sync.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from sync.reconcile import held_from
from sync.strategy import SyncState
from warehouse import ops
from warehouse.ddl import CLINICAL
from warehouse.ident import qualified, quote
from warehouse.load import Warehouse
from warehouse.normalise import REJECT

LOCK_WAIT_SECONDS = 120.0


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def read_state(warehouse_path: str | Path, entity: EntitySet) -> SyncState:
    if not Path(warehouse_path).exists():
        return SyncState()
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        try:
            row = ops.sync_state(wh.con, entity.name)
        except duckdb.CatalogException:  # the schema was never created
            return SyncState()
    if row is None:
        return SyncState()
    return SyncState(watermark=row[0], last_snapshot_at=_utc(row[1]))


def read_held_keys(warehouse_path: str | Path, entity: EntitySet) -> set[Any]:
    """The keys an increment reconciles against, in the API's kind: every record the
    warehouse holds live, and every key the source sent that was rejected (it is in the
    source's count, though not in the table)."""
    if not Path(warehouse_path).exists():
        return set()
    table, key = qualified(CLINICAL, entity.table), quote(entity.key)
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        try:
            live = wh.con.execute(f'SELECT {key} FROM {table} WHERE "_deleted_at" IS NULL')
            keys = [k for (k,) in live.fetchall()]
            rejected = ops.rejected_keys(wh.con, entity.name, REJECT)
        except duckdb.CatalogException:  # the schema was never created
            return set()
    return held_from(entity, [*keys, *rejected])


def read_parents(warehouse_path: str | Path, entity: EntitySet, reference: str) -> dict[Any, Any]:
    """Live key -> the parent its `reference` names, for a child riding in its parent's
    pages: a child held under a parent read whole that did not come with it is gone."""
    if not Path(warehouse_path).exists():
        return {}
    table = qualified(CLINICAL, entity.table)
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        try:
            rows = wh.con.execute(
                f"SELECT {quote(entity.key)}, {quote(reference)} FROM {table} "
                'WHERE "_deleted_at" IS NULL'
            ).fetchall()
        except duckdb.CatalogException:
            return {}
    return dict(rows)


def read_sizes(warehouse_path: str | Path) -> tuple[dict[str, int], dict[str, datetime | None]]:
    """Per set, the live rows and when it was last read whole: what the nightly budget
    weighs (sync/budget.py). Empty before the first sync."""
    rows: dict[str, int] = {}
    whole: dict[str, datetime | None] = {}
    if not Path(warehouse_path).exists():
        return rows, whole
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        for entity in ALL_ENTITIES:
            table = qualified(CLINICAL, entity.table)
            try:
                (rows[entity.name],) = wh.con.execute(
                    f'SELECT count(*) FROM {table} WHERE "_deleted_at" IS NULL'
                ).fetchone()
            except duckdb.CatalogException:
                continue
        with contextlib.suppress(duckdb.CatalogException):
            whole = {name: _utc(at) for name, at in ops.last_snapshots(wh.con).items()}
    return rows, whole


def last_read_whole(con: duckdb.DuckDBPyConnection, entity: EntitySet) -> datetime | None:
    """When `entity` was last read whole (its last snapshot), on an open connection."""
    row = ops.sync_state(con, entity.name)
    return _utc(row[1]) if row else None
