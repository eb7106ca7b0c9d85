"""The warehouse as a model: the merge's rules over records as the service sent them.

Thousands of seeds cannot each pay for normalising into Arrow, writing Parquet and a
DuckDB transaction per set; what the simulation asks is what the engine hands to its
batches (records, deletes, watermarks), and whether the warehouse that loads them ends equal
to the source. So the engine writes to memory (`MemoryBatches`, the `sync.extract.Batches`
seam) and `ModelWarehouse` applies warehouse/merge.py's rules (tested against the real merge
in tests/test_warehouse_merge_model.py): per key the newest version of a load by change
cursor, then extraction time, batch and row; a newer one replaces the held version (by
cursor where both have a different one, else by extraction time); a snapshot marks deleted
what it did not see and was extracted before it; a key an extraction found gone is marked
deleted unless a later extraction holds it. Some seeds run the real lake and DuckDB instead
(`World(..., backend="duckdb")`), so the model is held to the real thing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from connectors.clinical_records.catalogue import Canonical, EntitySet
from connectors.clinical_records.keys import entity_key
from sync.budget import Coverage
from sync.strategy import Plan, SyncState, watermark_of
from warehouse.converters import CONVERTERS, to_timestamptz

_serial = itertools.count()


def cursor_values(entity: EntitySet, records: list[dict]) -> list[datetime | date | None]:
    """The change cursor of each record as the merge orders by it, converted as the
    normaliser converts it (every form the spec's type allows; None where it does not fit,
    and for a text cursor, which does not order: no format stated)."""
    name = entity.cursor
    if name is None or entity.field(name).canonical is Canonical.VARCHAR:
        return [None] * len(records)
    return _as_canonical(entity, name, records)


def _as_canonical(entity: EntitySet, name: str, records: list[dict]) -> list[Any]:
    """Each value as the normaliser's converter makes it; the common ISO forms parsed here
    first (the converter's slow path costs milliseconds for the forms it alone reads)."""
    fld = entity.field(name)
    found: list[Any] = []
    odd: list[int] = []
    for i, record in enumerate(records):
        value = record.get(name)
        found.append(_iso(value, fld.canonical) if isinstance(value, str) else None)
        if isinstance(value, str) and found[-1] is None:
            odd.append(i)
    if odd:
        sent = pa.array([records[i][name] for i in odd], pa.string())
        for i, value in zip(
            odd, CONVERTERS[fld.canonical](sent, fld).values.to_pylist(), strict=True
        ):
            found[i] = value
    return found


def _iso(text: str, kind: Canonical) -> datetime | date | None:
    """The plain ISO forms (a date; seconds, up to six fractional digits, Z or an offset)."""
    try:
        if kind is Canonical.DATE:
            return date.fromisoformat(text) if len(text) == 10 else None
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None or not text[:4].isdigit() or "T" not in text:
        return None
    return moment.astimezone(UTC)


def _watermark_cursors(entity: EntitySet, records: list[dict]) -> list[Any]:
    """The cursor as the watermark weighs it: a text cursor too, as the instant it names."""
    name = entity.cursor
    if name is None or not records:
        return []
    if entity.field(name).canonical is not Canonical.VARCHAR:
        return _as_canonical(entity, name, records)
    sent = pa.array([r.get(name) if isinstance(r.get(name), str) else None for r in records])
    return to_timestamptz(sent, entity.field(name)).values.to_pylist()


class RawWriter:
    """An extraction's batch kept in memory, records as sent (the `BatchWriter` it stands
    for normalises them and writes Parquet)."""

    def __init__(self, plan: Plan, run_id: str, previous_watermark: str | None) -> None:
        self.plan, self.entity, self.run_id = plan, plan.entity, run_id
        self.previous = None if plan.snapshot else previous_watermark
        self.extracted_at = datetime.now(UTC)
        self.order = next(_serial)
        self.records: list[dict] = []
        self.deletes: list[str] = []
        self.files: list[str] = []
        self.rejected = 0
        self.watermark: str | None = None
        self.key_range: tuple[str | None, str | None] | None = None

    def add(self, records: list[dict]) -> None:
        self.records.extend(records)

    def finish(self, deletes: list[str] | None = None) -> None:
        self.deletes = deletes or []
        self.rejected = sum(1 for r in self.records if self.key(r) is None)
        if self.plan.moves_watermark:
            cursors = _watermark_cursors(self.entity, self.records)
            highest = max((c for c in cursors if c is not None), default=None)
            self.watermark = watermark_of(
                self.entity, [highest], self.previous, ceiling=self.extracted_at
            )
        if self.records or self.plan.snapshot or self.deletes or self.watermark:
            self.files.append(f"memory:{self.order}")

    def key(self, record: dict) -> Any:
        return entity_key(self.entity, record.get(self.entity.key))


@dataclass
class MemoryBatches:
    """`sync.extract.Batches` in memory: every writer by its one file's name."""

    writers: dict[str, RawWriter] = field(default_factory=dict)

    def writer(self, plan: Plan, run_id: str, previous_watermark: str | None) -> RawWriter:
        writer = RawWriter(plan, run_id, previous_watermark)
        self.writers[f"memory:{writer.order}"] = writer
        return writer


@dataclass
class Version:
    record: dict
    cursor: datetime | date | None
    extracted: datetime
    deleted: datetime | None = None


class ModelWarehouse:
    """Live and deleted records per set, and the sync state, as the merge leaves them; reads
    as `sync.state.CommittedState` does."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[Any, Version]] = {}
        self.states: dict[str, SyncState] = {}

    # -- what an extraction starts from (sync.inputs.CommittedState) ------------------------

    def state(self, entity: EntitySet) -> SyncState:
        return self.states.get(entity.name, SyncState())

    def held_keys(self, entity: EntitySet) -> set[Any]:
        return set(self.live(entity))

    def parents(self, entity: EntitySet, reference: str) -> dict[Any, Any]:
        return {k: v.record.get(reference) for k, v in self.live_versions(entity).items()}

    def sizes(self) -> tuple[dict[str, int], dict[str, Coverage]]:
        return {name: len(self.live_versions_of(name)) for name in self.tables}, {}

    def live(self, entity: EntitySet) -> dict[Any, dict]:
        return {k: v.record for k, v in self.live_versions(entity).items()}

    def live_versions(self, entity: EntitySet) -> dict[Any, Version]:
        return self.live_versions_of(entity.name)

    def live_versions_of(self, name: str) -> dict[Any, Version]:
        return {k: v for k, v in self.tables.get(name, {}).items() if v.deleted is None}

    # -- a load ----------------------------------------------------------------------------

    def load(
        self, entity: EntitySet, writers: list[RawWriter], *, snapshot: bool, watermark: str | None
    ) -> None:
        table = self.tables.setdefault(entity.name, {})
        newest: dict[Any, tuple[tuple, Version]] = {}
        for writer in sorted(writers, key=lambda w: (w.extracted_at, w.order)):
            cursors = cursor_values(entity, writer.records) if writer.records else []
            for row, (record, cursor) in enumerate(zip(writer.records, cursors, strict=True)):
                key = writer.key(record)
                if key is None:
                    continue
                rank = (
                    cursor is not None,
                    _sortable(cursor),
                    writer.extracted_at,
                    writer.order,
                    row,
                )
                if key not in newest or rank > newest[key][0]:
                    newest[key] = (rank, Version(record, cursor, writer.extracted_at))
        for key, (_, new) in newest.items():
            held = table.get(key)
            if held is None:
                table[key] = new
                continue
            if new.cursor is not None and held.cursor is not None and new.cursor != held.cursor:
                newer = new.cursor > held.cursor
            else:
                newer = new.extracted >= held.extracted
            if not newer:
                continue
            back = held.deleted is not None and new.extracted > held.deleted
            new.deleted = None if back else held.deleted
            table[key] = new
        if snapshot and writers:
            at = max(w.extracted_at for w in writers)
            for key, held in table.items():
                if held.deleted is None and key not in newest and held.extracted <= at:
                    held.deleted = at
        for writer in writers:
            for text in writer.deletes:
                key = entity_key(entity, text)
                held = table.get(key)
                if (
                    held is not None
                    and held.deleted is None
                    and held.extracted <= writer.extracted_at
                ):
                    held.deleted = writer.extracted_at
        state = self.state(entity)
        self.states[entity.name] = SyncState(
            watermark=watermark if watermark is not None else state.watermark,
            last_snapshot_at=max(w.extracted_at for w in writers)
            if snapshot and writers
            else state.last_snapshot_at,
            range_position=state.range_position,
        )


def _sortable(cursor: datetime | date | None) -> tuple:
    if cursor is None:
        return ()
    if isinstance(cursor, datetime):
        return (cursor.timestamp(),)
    return (datetime(cursor.year, cursor.month, cursor.day, tzinfo=UTC).timestamp(),)
