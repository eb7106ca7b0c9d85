"""What one sync of one entity set fetches: a snapshot, the rows past the watermark, a date
range, or nothing. Pure decisions from the catalogue's `Strategy`, the committed sync state
and the run's options, so they are tested without a server or a warehouse.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum

from connectors.clinical_records.catalogue import Canonical, EntitySet, Strategy

log = logging.getLogger(__name__)


class Mode(StrEnum):
    SNAPSHOT = "snapshot"  # every record; what is missing was deleted at the source
    INCREMENTAL = "incremental"  # records whose cursor is at or past the watermark (less lookback)
    RANGE = "range"  # an increment (where there is a cursor) and a key range read whole
    BACKFILL = "backfill"  # records whose cursor lies in a date range; the watermark stays
    SKIP = "skip"  # nothing due this run


@dataclass(frozen=True)
class SyncState:
    """The committed state of one entity set (a row of `ops.sync_state`)."""

    watermark: str | None = None
    last_snapshot_at: datetime | None = None
    range_position: str | None = None  # where the next key range read starts (None: first key)


@dataclass(frozen=True)
class Options:
    """How this run syncs: forced snapshots, a backfill range, the lookback and the cadence."""

    full: bool = False
    lookback: timedelta = timedelta(hours=1)
    snapshot_every: timedelta = timedelta(days=7)
    backfill_from: date | None = None
    backfill_to: date | None = None  # exclusive
    # Exact every run: a set whose records carry no `updated_at` is read whole every run (its
    # updates and deletes show no other way); off, such sets wait for the snapshot cadence.
    exact: bool = True
    # Under a nightly budget, the sets without updated_at that this run reads whole
    # (sync/budget.py); None: all of them.
    read_whole: frozenset[str] | None = None
    # And the pages of a key range each of some others reads (the rest of the budget).
    read_ranges: Mapping[str, int] = field(default_factory=dict)

    def whole(self, entity: EntitySet) -> bool:
        """Read `entity` (no updated_at) whole this run to keep it exact?"""
        return self.exact and (self.read_whole is None or entity.name in self.read_whole)

    @property
    def backfill(self) -> bool:
        return self.backfill_from is not None


@dataclass(frozen=True)
class Plan:
    entity: EntitySet
    mode: Mode
    reason: str
    since: datetime | date | None = None  # lower bound of the cursor, inclusive
    until: datetime | date | None = None  # upper bound of the cursor, exclusive
    range_pages: int = 0  # RANGE: pages of the key range read whole
    range_from: str | None = None  # RANGE: the key it starts from (None: the first key)

    @property
    def snapshot(self) -> bool:
        return self.mode is Mode.SNAPSHOT

    @property
    def moves_watermark(self) -> bool:
        """A backfill re-reads old rows; only snapshots and increments advance the watermark."""
        return self.mode in (Mode.SNAPSHOT, Mode.INCREMENTAL, Mode.RANGE)


def cursor_is_date(entity: EntitySet) -> bool:
    return entity.cursor is not None and entity.field(entity.cursor).canonical is Canonical.DATE


def parse_watermark(entity: EntitySet, text: str) -> datetime | date:
    """The stored watermark (ISO text) as the cursor's type."""
    if cursor_is_date(entity):
        return date.fromisoformat(text[:10])
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _since(entity: EntitySet, watermark: str, lookback: timedelta) -> datetime | date:
    """`watermark - lookback`; a date cursor re-reads the whole last date ("ge last date")."""
    mark = parse_watermark(entity, watermark)
    return mark if isinstance(mark, date) and not isinstance(mark, datetime) else mark - lookback


def _snapshot_due(state: SyncState, options: Options, now: datetime) -> bool:
    last = state.last_snapshot_at
    return last is None or now - last >= options.snapshot_every


def _plan_cursor(
    entity: EntitySet, state: SyncState, options: Options, now: datetime, over_budget: bool = False
) -> Plan:
    assert state.watermark is not None
    since = _since(entity, state.watermark, options.lookback)
    reason = f"{entity.cursor} ge {since.isoformat()}"
    if over_budget:
        reason = f"{OVER_BUDGET}; {reason}"
    return Plan(entity, Mode.INCREMENTAL, reason, since)


def _plan_snapshot(entity: EntitySet, state: SyncState, options: Options, now: datetime) -> Plan:
    return Plan(entity, Mode.SNAPSHOT, "small set: a snapshot every run")


def _plan_range(entity: EntitySet, state: SyncState, options: Options) -> Plan:
    """Over the budget, a share of it: the new rows (where there is a cursor), and a key
    range read whole from where the last one ended, its updates and deletes with it."""
    pages = options.read_ranges[entity.name]
    start = "the first key" if state.range_position is None else "where the last range ended"
    reason = f"over the nightly budget: a key range of {pages} pages from {start}"
    since = None
    if entity.cursor is not None and state.watermark is not None:
        since = _since(entity, state.watermark, options.lookback)
        reason += f", and {entity.cursor} ge {since.isoformat()}"
    return Plan(
        entity, Mode.RANGE, reason, since, range_pages=pages, range_from=state.range_position
    )


def _plan_created(entity: EntitySet, state: SyncState, options: Options, now: datetime) -> Plan:
    if options.whole(entity):
        return Plan(entity, Mode.SNAPSHOT, EXACT_REASON)
    if options.exact:  # over the nightly budget: new rows only, updates wait
        return _plan_cursor(entity, state, options, now, over_budget=True)
    if _snapshot_due(state, options, now):
        return Plan(entity, Mode.SNAPSHOT, "periodic snapshot due (catches updates and deletes)")
    return _plan_cursor(entity, state, options, now)


def _plan_periodic(entity: EntitySet, state: SyncState, options: Options, now: datetime) -> Plan:
    if options.whole(entity):
        return Plan(entity, Mode.SNAPSHOT, EXACT_REASON)
    if options.exact:
        return Plan(entity, Mode.SKIP, OVER_BUDGET)
    if _snapshot_due(state, options, now):
        return Plan(entity, Mode.SNAPSHOT, "periodic snapshot due")
    assert state.last_snapshot_at is not None
    due = (state.last_snapshot_at + options.snapshot_every).isoformat(timespec="seconds")
    return Plan(entity, Mode.SKIP, f"no cursor; next snapshot due {due}")


def _plan_per_patient(entity: EntitySet, state: SyncState, options: Options, now: datetime) -> Plan:
    if options.read_whole is not None and entity.name not in options.read_whole:
        return Plan(entity, Mode.SKIP, OVER_BUDGET)
    return Plan(entity, Mode.SNAPSHOT, "listed whole in the patients' pages ($expand)")


EXACT_REASON = "no updated_at: read whole every run to stay exact"
OVER_BUDGET = "over the nightly budget: staler sets were read first"

PLANNERS: dict[Strategy, Callable[[EntitySet, SyncState, Options, datetime], Plan]] = {
    Strategy.CURSOR: _plan_cursor,
    Strategy.SNAPSHOT: _plan_snapshot,
    Strategy.CREATED: _plan_created,
    Strategy.PERIODIC_SNAPSHOT: _plan_periodic,
    Strategy.PER_PATIENT: _plan_per_patient,
}


def _bound(entity: EntitySet, day: date | None) -> datetime | date | None:
    if day is None or cursor_is_date(entity):
        return day
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def plan(
    entity: EntitySet, state: SyncState, options: Options, now: datetime | None = None
) -> Plan:
    """Decide what this run fetches for `entity`."""
    now = now or datetime.now(UTC)
    if options.backfill:
        if entity.cursor is None or entity.contained_in is not None:
            return Plan(entity, Mode.SKIP, "no cursor of its own to select a date range by")
        since, until = _bound(entity, options.backfill_from), _bound(entity, options.backfill_to)
        reason = f"backfill {entity.cursor} from {options.backfill_from} to {options.backfill_to}"
        return Plan(entity, Mode.BACKFILL, reason, since, until)
    if options.full:
        return Plan(entity, Mode.SNAPSHOT, "full sync requested")
    if state.watermark is None and entity.strategy in (Strategy.CURSOR, Strategy.CREATED):
        return Plan(entity, Mode.SNAPSHOT, "no watermark yet: first sync")
    if options.exact and entity.name in options.read_ranges:  # the budget's share
        return _plan_range(entity, state, options)
    return PLANNERS[entity.strategy](entity, state, options, now)


def watermark_of(
    entity: EntitySet, values: list[object], previous: str | None, ceiling: datetime
) -> str | None:
    """The highest cursor value seen (ISO text), never below the previous watermark and never
    after `ceiling`, when the extraction began. A cursor in the future (a typo, or a sentinel
    such as 9999-12-31) would otherwise hold the watermark there, and every later increment
    would skip the changes made until then; capped, the next increment re-reads that record
    and goes on from here."""
    if entity.cursor is None:
        return previous
    seen = [v for v in values if v is not None]
    if previous is not None:
        seen.append(parse_watermark(entity, previous))
    if not seen:
        return None
    highest = max(seen)  # type: ignore[type-var]
    cap = ceiling.date() if cursor_is_date(entity) else ceiling
    if highest > cap:
        log.warning(
            "%s: %s reaches %s, after the extraction began; the watermark stays at %s",
            entity.name,
            entity.cursor,
            highest.isoformat(),
            cap.isoformat(),
        )
        highest = cap
    return highest.isoformat()
