"""The load path's shortcuts give the same answers as the general paths they skip.

Dates and date-times in the common shape are cast in one go, and the newest-per-key step
runs only when a load holds a key twice; each test mixes a shortcut case with one that
needs the general path.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS
from tests.warehouse_records import record
from warehouse.normalise import normalise


def test_an_impossible_datetime_among_plain_ones_is_kept_raw_and_the_rest_converted():
    records = [
        record(APPOINTMENTS, 1, start_datetime="2026-01-02T09:30:00.5+02:00"),
        record(APPOINTMENTS, 2, start_datetime="2026-02-30T09:30:00Z"),
        record(APPOINTMENTS, 3, start_datetime="2026-01-02T23:00:00-05:00"),
    ]
    batch = normalise(APPOINTMENTS, records)
    assert [r.key for r in batch.unfit] == ["app-2"] and not batch.errors
    assert "start_datetime: not a valid date-time" in batch.unfit[0].reason
    assert batch.table.column("start_datetime").to_pylist() == [
        datetime(2026, 1, 2, 7, 30, 0, 500000, tzinfo=UTC),
        None,
        datetime(2026, 1, 3, 4, 0, tzinfo=UTC),
    ]


def test_an_impossible_date_among_good_ones_is_kept_raw_and_the_rest_converted():
    records = [
        record(CLAIMS, 1, date_of_service="2024-02-29"),
        record(CLAIMS, 2, date_of_service="2026-02-29"),
        record(CLAIMS, 3, date_of_service=None),
    ]
    batch = normalise(CLAIMS, records)
    assert [r.key for r in batch.unfit] == ["2"] and not batch.errors
    assert "not a calendar date" in batch.unfit[0].reason
    assert batch.table.column("date_of_service").to_pylist() == [date(2024, 2, 29), None, None]


def test_a_key_twice_in_one_batch_keeps_the_newest_current_and_both_in_history(harness):
    pages = [
        record(CLAIMS, 1, total_claim_amount="5", updated_at="2026-02-05"),
        record(CLAIMS, 1, total_claim_amount="4", updated_at="2026-02-01"),
        record(CLAIMS, 2, total_claim_amount="7", updated_at="2026-02-01"),
        record(CLAIMS, 2, total_claim_amount="8", updated_at="2026-02-01"),  # later row wins
    ]
    result = harness.sync(CLAIMS, pages)
    assert (result.inserted, result.updated, result.fetched) == (2, 2, 4)
    rows = harness.rows('SELECT "id", "total_claim_amount"::INTEGER FROM "clinical"."claims"')
    assert sorted(rows) == [(1, 5), (2, 8)]
    history = harness.rows(
        'SELECT "id", "total_claim_amount"::INTEGER, "_valid_to" IS NULL FROM "history"."claims"'
    )
    assert sorted(history) == [(1, 4, False), (1, 5, True), (2, 7, False), (2, 8, True)]


def test_a_change_only_in_unknown_fields_is_a_new_version(harness):
    harness.sync(CLAIMS, [record(CLAIMS, 1, extra_note="a")], day=0)
    same = harness.sync(CLAIMS, [record(CLAIMS, 1, extra_note="a")], day=1)
    changed = harness.sync(CLAIMS, [record(CLAIMS, 1, extra_note="b")], day=2)
    assert (same.unchanged, changed.updated) == (1, 1)
    versions = harness.rows(
        'SELECT "_extras"->>\'extra_note\', "_valid_to" IS NULL FROM "history"."claims" '
        'ORDER BY "_valid_from"'
    )
    assert versions == [("a", False), ("b", True)]
