"""Canonical types on a real DuckDB file through real Parquet: money, time, ids, raw values."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENTS,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PRESCRIPTIONS,
    Canonical,
    EntitySet,
)
from tests.warehouse_records import record


def test_decimals_round_trip_exactly(harness):
    claims = [
        record(CLAIMS, 1, total_claim_amount="0.10"),
        record(CLAIMS, 2, total_claim_amount="0.20"),
        record(CLAIMS, 3, total_claim_amount="99999999999999999999999999.999999999999"),
        record(CLAIMS, 4, total_claim_amount="-0.000000000001"),
        record(CLAIMS, 5, total_claim_amount="7"),
    ]
    harness.sync(CLAIMS, claims)
    (total,) = harness.rows(
        'SELECT sum("total_claim_amount") FROM "clinical"."claims" WHERE "id" IN (1, 2)'
    )[0]
    assert total == Decimal("0.30")
    values = dict(harness.rows('SELECT "id", "total_claim_amount" FROM "clinical"."claims"'))
    assert values[3] == Decimal("99999999999999999999999999.999999999999")
    assert values[4] == Decimal("-0.000000000001")
    assert values[5] == Decimal("7")
    (kind,) = harness.rows(
        "SELECT data_type FROM duckdb_columns() WHERE schema_name = 'clinical' "
        "AND table_name = 'claims' AND column_name = 'total_claim_amount'"
    )[0]
    assert kind == "DECIMAL(38,12)"


def test_offsets_are_normalised_to_utc_and_times_parsed(harness):
    harness.sync(
        APPOINTMENTS,
        [
            record(
                APPOINTMENTS,
                1,
                start_datetime="2026-01-02T09:30:00.123456+02:00",
                end_datetime="2026-01-02T10:00:00-05:00",
                updated_at="2026-01-02T23:30:00Z",
                start_time="09:30:00",
                appointment_date="2026-01-02",
            )
        ],
    )
    start, end, updated, clock, day, extras = harness.rows(
        'SELECT "start_datetime", "end_datetime", "updated_at", "start_time", '
        '"appointment_date", "_extras" FROM "clinical"."appointments"'
    )[0]
    assert start == datetime(2026, 1, 2, 7, 30, 0, 123456, tzinfo=UTC)
    assert end == datetime(2026, 1, 2, 15, 0, tzinfo=UTC)
    assert updated == datetime(2026, 1, 2, 23, 30, tzinfo=UTC)
    assert clock == time(9, 30)
    assert str(day) == "2026-01-02"
    assert extras is None  # every value held as sent


def test_a_fraction_finer_than_microseconds_is_cut_kept_as_sent_and_counted(harness):
    fine = "2026-01-02T09:30:00.1234567+02:00"
    harness.sync(APPOINTMENTS, [record(APPOINTMENTS, 1, start_datetime=fine)])
    start, extras = harness.rows(
        'SELECT "start_datetime", "_extras" FROM "clinical"."appointments"'
    )[0]
    assert start == datetime(2026, 1, 2, 7, 30, 0, 123456, tzinfo=UTC)
    assert json.loads(extras) == {"start_datetime": fine}
    (fields, why) = harness.rows(
        'SELECT "fields", "reason" FROM "ops"."rejects" WHERE "kind" = \'unfit\''
    )[0]
    assert fields == ["start_datetime"] and "cut to microseconds" in why


def test_prescription_created_at_is_the_text_as_sent(harness):
    sent = ["2026-01-05T12:00:00+01:00", "2026-01-05", "2026-01-05T12:00:00", "5 Jan 2026"]
    harness.sync(
        PRESCRIPTIONS,
        [record(PRESCRIPTIONS, i, created_at=text) for i, text in enumerate(sent)],
    )
    rows = dict(harness.rows('SELECT "id", "created_at" FROM "clinical"."prescriptions"'))
    assert rows == {str(i): text for i, text in enumerate(sent)}


def test_ids_join_across_resources_without_casts(harness):
    """A number sent for a string family is its decimal text: Prescriptions.patient_id 1234
    is patient "1234", never "01234", which Appointments.patient_id "01234" names."""
    harness.sync(PATIENTS, [record(PATIENTS, 1, id="1234"), record(PATIENTS, 2, id="01234")])
    harness.sync(
        APPOINTMENTS,
        [record(APPOINTMENTS, 1, patient_id="1234"), record(APPOINTMENTS, 2, patient_id="01234")],
    )
    harness.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, 9, patient_id=1234)])
    rows = harness.rows(
        'SELECT p."id", a."id", rx."id" FROM "clinical"."patients" p '
        'JOIN "clinical"."appointments" a ON a."patient_id" = p."id" '
        'JOIN "clinical"."prescriptions" rx ON rx."patient_id" = p."id"'
    )
    assert rows == [("1234", "app-1", "9")]
    types = dict(
        harness.rows(
            "SELECT table_name, data_type FROM duckdb_columns() WHERE schema_name = 'clinical' "
            "AND column_name = 'patient_id' AND table_name IN ('appointments', 'prescriptions')"
        )
    )
    assert types == {"appointments": "VARCHAR", "prescriptions": "VARCHAR"}


# A value outside its column's type costs that value alone: null, kept as sent, counted.
UNFIT = [
    (PRESCRIPTIONS, "patient_id", "12a4", "a JSON string where the spec sends an integer"),
    (CLAIMS, "prescription_id", "7", "a JSON string where the spec sends an integer"),
    (CLAIMS, "date_of_service", "2026-13-01", "not a calendar date"),
    (CLAIMS, "date_of_service", "2026-02-30", "not a calendar date"),
    (CLAIMS, "date_of_service", "01/02/2026", "not a date"),
    (CLAIMS, "total_claim_amount", "1.0000000000001", "more digits than DECIMAL(38,12) holds"),
    (CLAIMS, "total_claim_amount", "1" * 27, "more digits than DECIMAL(38,12) holds"),
    (CLAIMS, "total_claim_amount", "12,50", "not decimal text"),
    (CLAIMS, "total_claim_amount", "NaN", "not decimal text"),
    (APPOINTMENTS, "start_datetime", "2026-01-02 soon", "not an ISO 8601 date-time"),
    (APPOINTMENTS, "start_datetime", "2026-01-02T10:00:00", "without an offset (not taken as UTC)"),
    (APPOINTMENTS, "start_datetime", "2026-02-30T10:00:00Z", "not a valid date-time"),
    (APPOINTMENTS, "start_time", "25:00:00", "not a time"),
    (CLAIMS, "payment_plan", "yes", "a JSON string where the spec sends true or false"),
    (CLAIMS, "prescription_id", 1.5, "a JSON number where the spec sends an integer"),
    (CLAIMS, "billing_branch_id", 2**63, None),  # the branch family is text: kept
    (INSURANCE_VERIFICATIONS, "patient_insurance_id", 2**63, "an integer beyond BIGINT's range"),
    (APPOINTMENTS, "notes", {"a": 1}, "a JSON object where the spec sends text"),
    (CLAIMS, "date_of_service", "0000-01-01", "outside the years 0001-9999"),
    (APPOINTMENTS, "start_datetime", "9999-12-31T23:59:59-05:00", "outside the years 0001-9999"),
]


@pytest.mark.parametrize(("entity", "name", "value", "reason"), UNFIT)
def test_a_value_that_does_not_fit_costs_the_value_alone_kept_as_sent_and_counted(
    harness, entity: EntitySet, name, value, reason
):
    odd = record(entity, 2, **{name: value})
    result = harness.sync(entity, [record(entity, 1), odd, record(entity, 3)])
    assert (result.inserted, result.rejected, result.fetched) == (3, 0, 3)
    table = f'"clinical"."{entity.table}"'
    key = (
        odd[entity.key] if entity.key_field.canonical is Canonical.BIGINT else str(odd[entity.key])
    )
    held, extras = harness.rows(f'SELECT "{name}", "_extras" FROM {table} WHERE "id" = ?', [key])[0]
    notes = harness.rows(
        'SELECT "entity", "key", "fields", "reason", "raw_json" FROM "ops"."rejects" '
        "WHERE \"kind\" = 'unfit'"
    )
    if reason is None:  # fits after all
        assert str(held) == str(value) and extras is None and notes == []
        return
    assert held is None and json.loads(extras) == {name: value}
    assert len(notes) == 1
    ent, noted_key, fields, why, raw = notes[0]
    assert (ent, noted_key, fields) == (entity.name, str(odd[entity.key]), [name])
    assert reason in why and why.startswith(name) and why.endswith("kept as sent in _extras")
    assert json.loads(raw) == odd


NO_KEY = [
    (CLAIMS, None, "id: missing (required)"),
    (CLAIMS, "7", "id: a JSON string where the spec sends an integer"),
    (CLAIMS, 2**63, "id: an integer beyond BIGINT's range"),
    (PRESCRIPTIONS, 1.5, "id: a JSON number where the spec sends an integer"),
    (PATIENTS, "", "id: empty: names no record"),
    (PATIENTS, {"id": 1}, "id: a JSON object where the spec sends text"),
]


@pytest.mark.parametrize(("entity", "key", "reason"), NO_KEY)
def test_only_a_record_without_a_usable_key_is_rejected(harness, entity: EntitySet, key, reason):
    bad = (
        record(entity, 2, id=key, total_claim_amount="x")
        if entity is CLAIMS
        else record(entity, 2, id=key)
    )
    result = harness.sync(entity, [record(entity, 1), bad, record(entity, 3)])
    assert (result.inserted, result.rejected, result.fetched) == (2, 1, 3)
    (ent, sent_key, fields, why, raw) = harness.rows(
        'SELECT "entity", "key", "fields", "reason", "raw_json" FROM "ops"."rejects" '
        "WHERE \"kind\" = 'reject'"
    )[0]
    assert ent == entity.name and "id" in fields and why.startswith(reason)
    assert json.loads(raw) == bad
    assert sent_key == (None if key is None else str(key))  # as sent
    assert harness.rows('SELECT count(*) FROM "ops"."rejects" WHERE "kind" = \'unfit\'') == [(0,)]


def test_over_long_string_is_kept_in_full_with_a_warning(harness):
    name = "x" * 40  # max length 25
    result = harness.sync(PATIENTS, [record(PATIENTS, 1, first_name=name)])
    assert (result.inserted, result.rejected) == (1, 0)
    assert harness.rows('SELECT "first_name" FROM "clinical"."patients"') == [(name,)]
    (why,) = harness.rows('SELECT "reason" FROM "ops"."rejects" WHERE "kind" = \'warning\'')[0]
    assert "max length 25" in why


def test_half_a_surrogate_pair_is_kept_replaced_with_the_record_as_sent_in_a_warning(harness):
    """JSON can escape half of an emoji's UTF-16 pair (a string cut by the source); Python
    reads it, Arrow and DuckDB cannot store it."""
    cut = json.loads('{"first_name": "Zo\\ud83d", "note\\udc00": "x"}')
    result = harness.sync(PATIENTS, [record(PATIENTS, 1, **cut), record(PATIENTS, 2), "\ud83d"])
    assert (result.inserted, result.rejected) == (2, 1)  # the bare string is no record
    rows = harness.rows('SELECT "first_name", "_extras" FROM "clinical"."patients" ORDER BY "id"')
    assert rows[0][0] == "Zo\ufffd" and json.loads(rows[0][1]) == {"note\ufffd": "x"}
    (fields, why, raw) = harness.rows(
        'SELECT "fields", "reason", "raw_json" FROM "ops"."rejects" '
        "WHERE \"kind\" = 'warning' AND \"reason\" LIKE '%surrogate%'"
    )[0]
    assert sorted(fields) == ["first_name", "note\ufffd"]
    assert "U+FFFD" in why
    sent = json.loads(raw)
    assert sent["first_name"] == "Zo\\ud83d" and sent["note\\udc00"] == "x"


def test_unknown_fields_are_kept_in_extras_and_reported(harness):
    harness.sync(PATIENTS, [record(PATIENTS, 1, loyalty_tier="gold", flags={"vip": True})])
    rows = harness.rows(
        """SELECT "_extras"->>'loyalty_tier', "_extras"->'flags'->>'vip' FROM "clinical"."patients" """
    )
    assert rows == [("gold", "true")]
    reported = harness.rows(
        'SELECT "fields"[1] FROM "ops"."rejects" WHERE "kind" = \'warning\' ORDER BY 1'
    )
    assert reported == [("flags",), ("loyalty_tier",)]


def test_every_table_and_column_has_a_comment(harness):
    missing = harness.rows(
        "SELECT schema_name, table_name, column_name FROM duckdb_columns() "
        "WHERE schema_name IN ('clinical', 'history', 'ops') AND comment IS NULL"
    )
    assert missing == []
    (meaning,) = harness.rows(
        "SELECT comment FROM duckdb_columns() WHERE schema_name = 'clinical' "
        "AND table_name = 'claims' AND column_name = 'total_pt_responsibility_amount'"
    )[0]
    assert meaning == "Total patient responsibility"
    uncommented = harness.rows(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name IN ('clinical', 'history', "
        "'ops') AND comment IS NULL"
    )
    assert uncommented == []
