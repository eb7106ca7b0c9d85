"""The committed sync state an extraction starts from, read from `ops.sync_state`.

Read-only and brief: an extraction may run while another step loads, so it waits for the
writer's lock instead of failing. No warehouse yet means a first sync.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb

from connectors.clinical_records.catalogue import EntitySet
from pipelines.strategy import SyncState
from warehouse.load import Warehouse

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
            row = wh.con.execute(
                'SELECT "watermark", "last_snapshot_at" FROM "ops"."sync_state" WHERE "entity" = ?',
                [entity.name],
            ).fetchone()
        except duckdb.CatalogException:  # the schema was never created
            return SyncState()
    if row is None:
        return SyncState()
    return SyncState(watermark=row[0], last_snapshot_at=_utc(row[1]))
