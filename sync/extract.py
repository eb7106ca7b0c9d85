"""One extraction: the plan's records from the API, normalised, into immutable lake batches.

Writes Parquet only (never DuckDB), so extractions of different entity sets may run in
parallel. The watermark it computes travels with the result and is committed by the load.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Protocol
from uuid import uuid4

import pyarrow as pa
import pyarrow.compute as pc

from connectors.clinical_records.catalogue import PAGE_SIZE, Edm, EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.keys import entity_key
from connectors.clinical_records.query import Expr, Query, between
from sync.exactness import LastLook
from sync.phase import Phase, enter
from sync.progress import Progress
from sync.reconcile import Reconciler, Reconciliation
from sync.strategy import Mode, Plan, watermark_of
from warehouse.converters import to_timestamptz
from warehouse.lake import Lake
from warehouse.normalise import Reject, normalise
from warehouse.schema import arrow_schema

# Records as Python objects take about ten times their Arrow size, so they are normalised in
# small chunks; the normalised rows gather into large lake files, because every file and row
# group costs the writer, the load and an analyst's query a fixed amount.
NORMALISE_ROWS = 5_000
FILE_ROWS = 50_000


def _utc_text(moment: datetime) -> str:
    """A plain-string cursor (Prescriptions.created_at) is fixed-width UTC text with Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# How a bound is written for a cursor field of each spec type.
CURSOR_LITERAL: dict[Edm, Callable[[Any], Any]] = {
    Edm.DATETIME: lambda v: v,
    Edm.DATE: lambda v: v.date() if isinstance(v, datetime) else v,
    Edm.STRING: lambda v: _utc_text(v if isinstance(v, datetime) else _midnight(v)),
}


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def cursor_filter(plan: Plan) -> Expr | None:
    """`cursor ge since [and cursor lt until]` for increments and backfills; None for snapshots."""
    entity = plan.entity
    if plan.mode not in (Mode.INCREMENTAL, Mode.BACKFILL, Mode.RANGE) or entity.cursor is None:
        return None
    to_literal = CURSOR_LITERAL[entity.field(entity.cursor).type]
    since, until = (None if t is None else to_literal(t) for t in (plan.since, plan.until))
    return between(entity.cursor, since, until)


@dataclass
class Extraction:
    """What an extraction left in the lake, for the load and the run's metadata."""

    entity: str
    mode: Mode
    reason: str
    run_id: str
    files: list[str] = field(default_factory=list)
    fetched: int = 0
    rejected: int = 0
    source_total: int | None = None  # the set's count at the run's last look at it
    watermark: str | None = None  # to commit with the load; None leaves the stored one
    stats: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    reconciliation: Reconciliation = field(default_factory=Reconciliation)
    last_look: LastLook | None = None  # the look that settled the set (sync/exactness.py)
    mark: str | None = None  # the change mark it ended at, to look again from

    @property
    def snapshot(self) -> bool:
        return self.mode is Mode.SNAPSHOT

    def reconciled(self, reconciler: Reconciler, found: Reconciliation) -> None:
        """What reconciling found, the set's count at its last look, that look and the mark."""
        self.reconciliation = found
        self.source_total = reconciler.total
        self.last_look = reconciler.last_look
        self.mark = reconciler.saved_mark


def _max_cursor(entity: EntitySet, table: pa.Table) -> Any:
    if entity.cursor is None or table.num_rows == 0:
        return None
    column = table.column(entity.cursor)
    if pa.types.is_string(column.type):  # text as sent (no format stated): its instants
        column = to_timestamptz(column.combine_chunks(), entity.field(entity.cursor)).values
    return pc.max(column).as_py()


class BatchWriter:
    """Normalises every NORMALISE_ROWS records and writes a lake file every FILE_ROWS rows.

    The last file carries the watermark: a snapshot sees every record, so it recomputes it
    (a reset); an increment never moves it backwards; a backfill leaves it alone.
    """

    def __init__(self, lake: Lake, plan: Plan, run_id: str, previous_watermark: str | None) -> None:
        self.lake, self.entity, self.plan, self.run_id = lake, plan.entity, plan, run_id
        self.previous = None if plan.snapshot else previous_watermark
        self.extracted_at = datetime.now(UTC)
        self.snapshot_id = uuid4().hex if plan.snapshot else None
        self.records: list[dict] = []  # not normalised yet
        self.tables: list[pa.Table] = []  # normalised, not written yet
        self.rejects: list[Reject] = []  # of those tables' records
        self.files: list[str] = []
        self.cursors: list[Any] = []
        self.rejected = 0
        self.watermark: str | None = None
        self.deletes: list[str] = []
        self.key_range: tuple[str | None, str | None] | None = None  # a RANGE plan's, as read

    def add(self, records: list[dict]) -> None:
        self.records.extend(records)
        if len(self.records) >= NORMALISE_ROWS:
            self._normalise()
            if self._pending() >= FILE_ROWS:
                self._write(final=False)

    def finish(self, deletes: list[str] | None = None) -> None:
        """Write what is left as the last file, with the keys found deleted at the source;
        an increment that found nothing writes none."""
        self.deletes = deletes or []
        self._normalise()
        if self.plan.moves_watermark:
            self.watermark = watermark_of(
                self.entity, self.cursors, self.previous, ceiling=self.extracted_at
            )
        if self._pending() or self.files or self.plan.snapshot or self.deletes:
            self._write(final=True)  # the snapshot's or watermark's file, even when empty

    def _pending(self) -> int:
        """Rows and notes normalised but not written yet: both are held in memory."""
        return sum(t.num_rows for t in self.tables) + len(self.rejects)

    def _normalise(self) -> None:
        if not self.records:
            return
        batch = normalise(self.entity, self.records)
        self.records = []
        self.cursors.append(_max_cursor(self.entity, batch.table))
        self.rejected += len(batch.errors)
        self.tables.append(batch.table)
        self.rejects.extend(batch.rejects)

    def _write(self, *, final: bool) -> None:
        enter(Phase.LAKE, self.entity.name)
        path = self.lake.write(
            self.entity,
            pa.concat_tables(self.tables or [arrow_schema(self.entity).empty_table()]),
            run_id=self.run_id,
            extracted_at=self.extracted_at,
            snapshot_id=self.snapshot_id,
            watermark=self.watermark if final else None,
            snapshot_complete=final and self.plan.snapshot,
            rejects=self.rejects,
            deletes=self.deletes if final else (),
            key_range=self.key_range if final else None,
        )
        self.tables, self.rejects = [], []
        self.files.append(str(path))


class Batches(Protocol):
    """Where an extraction's records go: the lake (`LakeBatches`), or, in the simulation of
    whole runs (tests/simulation), memory that a model of the warehouse loads from."""

    def writer(self, plan: Plan, run_id: str, previous_watermark: str | None) -> BatchWriter: ...


@dataclass(frozen=True)
class LakeBatches:
    """Lake batches: normalised, written as Parquet (`BatchWriter`)."""

    lake: Lake

    def writer(self, plan: Plan, run_id: str, previous_watermark: str | None) -> BatchWriter:
        return BatchWriter(self.lake, plan, run_id, previous_watermark)


@dataclass
class KeyRange:
    """A RANGE plan's key range, [low, high): `range_pages` pages of the keys the warehouse
    holds from `range_from` on, so that its bounds are known before it is read (and read at
    full rate) and a held key in it that the read does not bring is known deleted."""

    entity: EntitySet
    low: Any
    high: Any  # None: to the last key
    held: list[Any]  # held keys in the range, sorted
    seen: set[Any] = field(default_factory=set)

    @classmethod
    def of(cls, plan: Plan, held: Iterable[Any]) -> KeyRange:
        entity = plan.entity
        ordered = sorted(held)
        low = None if plan.range_from is None else entity_key(entity, plan.range_from)
        start = 0 if low is None else bisect_left(ordered, low)
        end = start + plan.range_pages * PAGE_SIZE
        high = ordered[end] if end < len(ordered) else None
        return cls(entity, low, high, ordered[start : end if high is not None else None])

    def filter(self) -> Expr | None:
        return between(self.entity.key, self.low, self.high)

    def read(self, records: list[dict]) -> None:
        self.seen.update(entity_key(self.entity, r.get(self.entity.key)) for r in records)

    def gone(self) -> list[Any]:
        return [k for k in self.held if k not in self.seen]

    def as_text(self) -> tuple[str | None, str | None]:
        """The bounds as the lake and `ops.sync_state` keep them."""
        return _text(self.low), _text(self.high)


def _text(key: Any) -> str | None:
    return None if key is None else str(key)


def record_writer(result: Extraction, writer: BatchWriter, fetched: int) -> None:
    """What a finished writer left in the lake, into the extraction's result."""
    result.files = writer.files
    result.rejected = writer.rejected
    result.watermark = writer.watermark
    result.fetched = fetched


def extract(
    plan: Plan,
    client: ClinicalClient,
    batches: Batches,
    *,
    run_id: str,
    previous_watermark: str | None,
    progress: Progress,
    held: Iterable[Any] = (),
    budget: int | None = None,
) -> Extraction:
    """Run `plan`: page through the API, reconcile with the source as it stands at the end
    (sync/reconcile.py), write lake batches, compute the next watermark. `held` are the
    keys the warehouse holds live (an increment reconciles against them); `budget` caps the
    requests reconciliation may spend (default: `reconcile.default_budget`)."""
    entity = plan.entity
    result = Extraction(entity.name, plan.mode, plan.reason, run_id)
    if plan.mode is Mode.SKIP:
        return result
    started = time.monotonic()
    with client.stats.measure(result.stats):  # its own cost, on a client it may share
        enter(Phase.EXTRACT, entity.name)
        writer = batches.writer(plan, run_id, previous_watermark)
        reconciler = None
        if plan.moves_watermark:  # a backfill reads a date range, not the set
            reconciler = Reconciler(entity, client, to_batch=writer.add, held=held)
            reconciler.begin()
        progress.start(entity.name)
        key_range = KeyRange.of(plan, held) if plan.mode is Mode.RANGE else None
        reads: list[tuple[Expr | None, KeyRange | None]] = []
        if key_range is None or plan.since is not None:  # a RANGE without a cursor: range only
            reads.append((cursor_filter(plan), None))
        if key_range is not None:
            writer.key_range = key_range.as_text()
            reads.append((key_range.filter(), key_range))
        for condition, within in reads:
            for page in client.iter_pages(entity, Query(entity, filter=condition)):
                writer.add(page.records)
                if reconciler:
                    reconciler.read(page.records)
                if within:
                    within.read(page.records)
                result.fetched += len(page.records)
                progress.page(entity.name, len(page.records), page.total)
        if key_range is not None and reconciler:
            reconciler.forget(key_range.gone())  # held in the range, not in it now: deleted
        if reconciler:  # the set as it stands at the end
            result.reconciled(reconciler, reconciler.finish(budget))
        writer.finish(reconciler.deleted_keys() if reconciler else None)
        progress.finish(entity.name)
        record_writer(result, writer, result.fetched)
    result.seconds = round(time.monotonic() - started, 3)
    return result
