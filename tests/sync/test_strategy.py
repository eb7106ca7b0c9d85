"""The sync plan per strategy, the cursor filters it renders, watermarks and progress."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENTS,
    BRANCHES,
    CLAIMS,
    DOCUMENTS,
    ENTITY_SETS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PRESCRIPTIONS,
    Strategy,
)
from connectors.clinical_records.query import Query
from sync.extract import KeyRange, _max_cursor, cursor_filter
from sync.progress import Progress, Tally, TerminalProgress
from sync.strategy import Mode, Options, SyncState, plan, watermark_of
from tests.warehouse_records import record
from warehouse.normalise import normalise

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
RECENT = SyncState(watermark="2026-11-19T22:30:00+00:00", last_snapshot_at=NOW - timedelta(days=1))


def render(p) -> str | None:
    expr = cursor_filter(p)
    return Query(p.entity, filter=expr).params().get("$filter") if expr else None


def test_first_sync_of_every_set_is_a_snapshot():
    for entity in ENTITY_SETS:
        assert plan(entity, SyncState(), Options(), NOW).mode is Mode.SNAPSHOT, entity.name


def test_cursor_set_reads_from_watermark_minus_lookback():
    p = plan(APPOINTMENTS, RECENT, Options(lookback=timedelta(minutes=90)), NOW)
    assert p.mode is Mode.INCREMENTAL and p.moves_watermark
    assert render(p) == "updated_at ge 2026-11-19T21:00:00Z"


def test_date_cursor_rereads_the_whole_last_date():
    state = SyncState(watermark="2026-11-19", last_snapshot_at=NOW)
    p = plan(CLAIMS, state, Options(lookback=timedelta(hours=5)), NOW)
    assert render(p) == "updated_at ge 2026-11-19"


def test_created_cursor_on_a_plain_string_field_uses_the_sources_text_form():
    p = plan(PRESCRIPTIONS, RECENT, Options(lookback=timedelta(0), exact=False), NOW)
    assert p.mode is Mode.INCREMENTAL
    assert render(p) == "created_at ge '2026-11-19T22:30:00Z'"


@pytest.mark.parametrize("entity", [PATIENTS, PRESCRIPTIONS, INSURANCE_VERIFICATIONS])
def test_periodic_snapshot_follows_the_cadence_when_exactness_is_off(entity):
    every = timedelta(days=7)
    cadence = Options(snapshot_every=every, exact=False)
    due = SyncState(RECENT.watermark, last_snapshot_at=NOW - every)
    assert plan(entity, due, cadence, NOW).mode is Mode.SNAPSHOT
    not_due = SyncState(RECENT.watermark, last_snapshot_at=NOW - every + timedelta(hours=1))
    expected = Mode.SKIP if entity.cursor is None else Mode.INCREMENTAL
    assert plan(entity, not_due, cadence, NOW).mode is expected


@pytest.mark.parametrize("entity", ENTITY_SETS)
def test_exact_runs_read_whole_every_set_blind_to_updates(entity):
    """By default a set without updated_at is read whole every run (its updates show no
    other way); a set with it reads from its watermark."""
    not_due = SyncState(RECENT.watermark, last_snapshot_at=NOW - timedelta(hours=1))
    p = plan(entity, not_due, Options(), NOW)
    if entity.sees_updates and entity.strategy is not Strategy.SNAPSHOT:
        assert p.mode is Mode.INCREMENTAL, entity.name
    else:
        assert p.mode is Mode.SNAPSHOT, entity.name


def test_over_budget_a_key_range_continues_where_the_last_ended():
    """A set given a share of the nightly budget reads a key range from the rotation's
    position, whole, and (with a cursor) its new rows; its bounds come from held keys."""
    over = Options(read_whole=frozenset(), read_ranges={PRESCRIPTIONS.name: 2})
    state = SyncState(RECENT.watermark, RECENT.last_snapshot_at, range_position="150")
    p = plan(PRESCRIPTIONS, state, over, NOW)
    assert (p.mode, p.range_pages, p.range_from) == (Mode.RANGE, 2, "150")
    assert p.moves_watermark and render(p) == "created_at ge '2026-11-19T21:30:00Z'"
    held = range(1, 501)
    key_range = KeyRange.of(p, held)
    assert (key_range.low, key_range.high) == (150, 350)  # two pages of held keys
    assert key_range.as_text() == ("150", "350")
    assert Query(PRESCRIPTIONS, filter=key_range.filter()).params()["$filter"] == (
        "(id ge 150 and id lt 350)"
    )
    key_range.read([{"id": k} for k in range(150, 350) if k != 200])
    assert key_range.gone() == [200]  # held in the range, not in it now: deleted
    last = KeyRange.of(plan(PRESCRIPTIONS, replace(state, range_position="450"), over, NOW), held)
    assert (last.low, last.high, len(last.held)) == (450, None, 51)  # to the last key
    no_cursor = plan(
        INSURANCE_VERIFICATIONS,
        SyncState(),
        replace(over, read_ranges={INSURANCE_VERIFICATIONS.name: 1}),
        NOW,
    )
    assert no_cursor.mode is Mode.RANGE and no_cursor.range_from is None
    assert render(no_cursor) is None  # no cursor: the range only


def test_documents_ride_whole_and_have_no_backfill():
    assert plan(DOCUMENTS, RECENT, Options(), NOW).mode is Mode.SNAPSHOT
    backfill = Options(backfill_from=date(2026, 10, 1), backfill_to=date(2026, 10, 3))
    assert plan(DOCUMENTS, RECENT, backfill, NOW).mode is Mode.SKIP


def test_small_sets_snapshot_every_run_and_full_forces_snapshots():
    assert plan(BRANCHES, RECENT, Options(), NOW).mode is Mode.SNAPSHOT
    for entity in ENTITY_SETS:
        assert plan(entity, RECENT, Options(full=True), NOW).snapshot


def test_backfill_reads_a_range_and_leaves_the_watermark():
    options = Options(backfill_from=date(2026, 10, 1), backfill_to=date(2026, 10, 3))
    p = plan(APPOINTMENTS, RECENT, options, NOW)
    assert p.mode is Mode.BACKFILL and not p.moves_watermark
    assert render(p) == (
        "(updated_at ge 2026-10-01T00:00:00Z and updated_at lt 2026-10-03T00:00:00Z)"
    )
    assert render(plan(CLAIMS, RECENT, options, NOW)) == (
        "(updated_at ge 2026-10-01 and updated_at lt 2026-10-03)"
    )
    assert plan(BRANCHES, RECENT, options, NOW).mode is Mode.SKIP


def test_every_strategy_of_the_catalogue_has_a_planner():
    synced = {e.strategy for e in ENTITY_SETS}
    assert synced <= {
        Strategy.CURSOR,
        Strategy.SNAPSHOT,
        Strategy.CREATED,
        Strategy.PERIODIC_SNAPSHOT,
    }


BEGAN = datetime(2027, 1, 1, tzinfo=UTC)  # when the extraction began


def test_a_text_cursor_moves_the_watermark_by_the_instants_it_names():
    """Prescriptions.created_at is text as sent (no format stated): the watermark is the
    newest instant among the values that name one; a date alone or no offset names none."""
    sent = ["2026-03-01", "2026-03-01T10:00:00+05:30", "2026-03-01T06:00:00Z", "2026-03-02T01:00"]
    batch = normalise(
        PRESCRIPTIONS, [record(PRESCRIPTIONS, i, created_at=t) for i, t in enumerate(sent)]
    )
    assert batch.table.column("created_at").to_pylist() == sent
    newest = _max_cursor(PRESCRIPTIONS, batch.table)
    assert newest == datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
    assert watermark_of(PRESCRIPTIONS, [newest], None, BEGAN) == "2026-03-01T06:00:00+00:00"


def test_watermark_never_moves_backwards():
    older = datetime(2026, 1, 1, tzinfo=UTC)
    newer = datetime(2026, 12, 1, tzinfo=UTC)
    previous = "2026-06-01T00:00:00+00:00"
    assert watermark_of(APPOINTMENTS, [older, None], previous, BEGAN) == previous
    assert watermark_of(APPOINTMENTS, [newer], previous, BEGAN) == newer.isoformat()
    assert watermark_of(CLAIMS, [date(2026, 3, 2)], None, BEGAN) == "2026-03-02"
    assert watermark_of(BRANCHES, [], None, BEGAN) is None


def test_a_cursor_in_the_future_holds_the_watermark_at_the_extraction_start(caplog):
    """One record updated "in 9999" must not make every later increment skip changes."""
    sentinel = datetime(9999, 12, 31, tzinfo=UTC)
    assert watermark_of(APPOINTMENTS, [sentinel], None, BEGAN) == BEGAN.isoformat()
    assert watermark_of(CLAIMS, [date(2099, 1, 1)], "2026-03-02", BEGAN) == "2027-01-01"
    # A watermark stored in the future by an earlier version comes back to the present.
    assert watermark_of(APPOINTMENTS, [], "2099-01-01T00:00:00+00:00", BEGAN) == BEGAN.isoformat()
    assert "updated_at reaches 9999-12-31" in caplog.text


def test_progress_counts_pages_and_reports_at_the_end():
    lines: list[str] = []
    progress = Progress(lines.append, every=2)
    for _ in range(3):
        progress.page("Claims", 100, 250)
    progress.finish("Claims")
    assert len(lines) == 2  # after page 2, and at the end
    assert "3/3 pages" in lines[-1] and "300 rows" in lines[-1]
    tally = Tally("X", total_records=1000)
    tally.pages = 4
    assert tally.total_pages == 10 and tally.eta_seconds is not None

    stream = io.StringIO()
    terminal = TerminalProgress(stream)
    terminal.page("Branches", 12, 12)
    terminal.finish("Branches")
    assert stream.getvalue().count("\n") == 1 and "Branches" in stream.getvalue()
