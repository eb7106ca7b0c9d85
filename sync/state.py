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
from sync.budget import Coverage
from sync.reconcile import held_from
from sync.strategy import SyncState
from warehouse import ledger, ops
from warehouse.ddl import CLINICAL
from warehouse.ident import qualified, quote
from warehouse.load import Warehouse
from warehouse.normalise import REJECT

LOCK_WAIT_SECONDS = 120.0


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class CommittedState:
    """A read-only look at what the warehouse committed, opened once for one extraction
    step (a family reads several sets' state, keys and parents). Before the first sync,
    or before the schema exists, every answer is empty."""

    def __init__(self, warehouse_path: str | Path) -> None:
        self.path = Path(warehouse_path)
        self._wh: Warehouse | None = None

    def __enter__(self) -> CommittedState:
        if self.path.exists():
            self._wh = Warehouse(self.path, read_only=True, wait=LOCK_WAIT_SECONDS).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._wh is not None:
            self._wh.__exit__(*exc)

    def _rows(self, sql: str, params: list[Any] | None = None) -> list[tuple]:
        if self._wh is None:
            return []
        try:
            return self._wh.con.execute(sql, params or []).fetchall()
        except duckdb.CatalogException:  # the schema was never created
            return []

    def state(self, entity: EntitySet) -> SyncState:
        row = None
        if self._wh is not None:
            with contextlib.suppress(duckdb.CatalogException):
                row = ops.sync_state(self._wh.con, entity.name)
        if row is None:
            return SyncState()
        return SyncState(watermark=row[0], last_snapshot_at=_utc(row[1]), range_position=row[2])

    def held_keys(self, entity: EntitySet) -> set[Any]:
        """The keys an increment reconciles against, in the API's kind: every record the
        warehouse holds live, and every key the source sent that was rejected (it is in the
        source's count, though not in the table)."""
        table, key = qualified(CLINICAL, entity.table), quote(entity.key)
        keys = [k for (k,) in self._rows(f'SELECT {key} FROM {table} WHERE "_deleted_at" IS NULL')]
        rejected: list[Any] = []
        if self._wh is not None:
            with contextlib.suppress(duckdb.CatalogException):
                rejected = ledger.rejected_keys(self._wh.con, entity.name, REJECT)
        return held_from(entity, [*keys, *rejected])

    def parents(self, entity: EntitySet, reference: str) -> dict[Any, Any]:
        """Live key -> the parent its `reference` names, for a child riding in its parent's
        pages: a child held under a parent read whole that did not come with it is gone."""
        table = qualified(CLINICAL, entity.table)
        return dict(
            self._rows(
                f"SELECT {quote(entity.key)}, {quote(reference)} FROM {table} "
                'WHERE "_deleted_at" IS NULL'
            )
        )

    def sizes(self) -> tuple[dict[str, int], dict[str, Coverage]]:
        """Per set, the live rows and how recently its records were read: what the nightly
        budget weighs (sync/budget.py)."""
        rows: dict[str, int] = {}
        for entity in ALL_ENTITIES:
            table = qualified(CLINICAL, entity.table)
            found = self._rows(f'SELECT count(*) FROM {table} WHERE "_deleted_at" IS NULL')
            if found:
                rows[entity.name] = found[0][0]
        read: dict[str, Coverage] = {}
        if self._wh is not None:
            with contextlib.suppress(duckdb.CatalogException):
                read = {
                    name: Coverage(_utc(covered), _utc(ranged))
                    for name, (covered, ranged) in ops.coverage(self._wh.con).items()
                }
        return rows, read


def covered_since(con: duckdb.DuckDBPyConnection, entity: EntitySet) -> datetime | None:
    """Since when every record of `entity` was read (a snapshot, or a completed rotation of
    key ranges), on an open connection."""
    covered, _ = ops.coverage(con).get(entity.name, (None, None))
    return _utc(covered)
