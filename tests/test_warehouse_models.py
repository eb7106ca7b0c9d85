"""The analytics models (dbt, transform/) link prescriptions, claims, verifications, patients
and physicians: each model's rows, as their SELECTs over the clinical tables make them (when
they are built, and what a failure keeps: tests/test_warehouse_models_builds.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    BY_NAME,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
    PHYSICIANS,
    PRESCRIPTIONS,
    Edm,
)
from pipelines.checks import references_by_table
from tests.warehouse_records import MODELS, Harness, analytics_rows, record, transform_models
from warehouse import dbt_catalogue, models
from warehouse.ddl import ANALYTICS_VIEWS, CHANGES_TABLE
from warehouse.load import SetResult
from warehouse.runs import FAILED, SUCCESS, RunEnding


def test_prescription_claims_excludes_soft_deleted_claims(linked):
    rows = linked.rows(
        "SELECT claim_id, total_claim_amount FROM analytics.prescription_claims ORDER BY claim_id"
    )
    assert rows == [(1, Decimal("0.10")), (2, Decimal("0.20"))]


def test_prescription_verifications(linked):
    rows = linked.rows(
        "SELECT verification_id, network_type FROM analytics.prescription_verifications "
        "WHERE prescription_id = 100 ORDER BY 1"
    )
    assert rows == [(7, "OUT"), (8, "IN")]


def test_prescription_summary_links_everything(linked):
    row = linked.rows(
        """SELECT patient_first_name, patient_last_name, branch_name, referring_physician,
                  primary_care_physician, claims, total_claim_amount, total_claim_paid,
                  latest_verification_id, latest_network_type, latest_pre_auth_necessary,
                  delivered_date, first_claim_date, days_prescription_to_delivery,
                  days_delivery_to_first_claim, days_prescription_to_first_claim
           FROM analytics.prescription_summary WHERE prescription_id = 100"""
    )
    assert row == [
        (
            "Zoë",
            "O'Brien",
            "North",
            "Ada Ref",
            "Bo Care",
            2,
            Decimal("0.30"),
            Decimal("0.10"),
            8,
            "IN",
            True,
            date(2026, 1, 11),
            date(2026, 1, 15),
            10,
            4,
            14,
        )
    ]
    other = linked.rows(
        "SELECT claims, total_claim_amount, delivered_date FROM analytics.prescription_summary "
        "WHERE prescription_id = 101"
    )
    assert other == [(0, Decimal("0"), None)]


def test_broken_references(linked):
    rows = linked.rows(
        "SELECT entity, record_id, reference, parent_id FROM analytics.broken_references "
        "ORDER BY ALL"
    )
    assert rows == [
        ("Appointments", "app-2", "patient_id", "404"),
        ("Claims", "3", "prescription_id", "999"),
        ("InsuranceVerifications", "9", "prescription_id", "555"),
        ("Prescriptions", "101", "branch_id", "101"),
        ("Prescriptions", "101", "primary_care_physician_id", "101"),
        ("Prescriptions", "101", "referring_physician_id", "101"),
    ]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "America/Los_Angeles"])
def test_delivery_date_is_the_date_as_written_in_any_readers_time_zone(tmp_path, zone):
    """delivered_on is free text; a date-time's date is the clinic's day as written, not
    the day the offset and the TimeZone of the session that builds the table would make."""
    h = Harness(tmp_path)
    written = {
        1: "2026-01-11T23:30:00-05:00",
        2: "2026-01-11T00:30:00+09:00",
        3: "2026-01-11 08:00",
        4: "2026-01-11",
        5: "left at the door",
    }
    h.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, k, delivered_on=v) for k, v in written.items()])
    h.rows(f"SET TimeZone = '{zone}'")  # the session that builds the table, and reads it
    models.build(h.path)
    days = dict(
        h.rows("SELECT prescription_id, delivered_date FROM analytics.prescription_summary")
    )
    assert days == {
        "1": date(2026, 1, 11),
        "2": date(2026, 1, 11),
        "3": date(2026, 1, 11),
        "4": date(2026, 1, 11),
        "5": None,
    }
    h.close()


def test_sync_health_and_status_show_each_sets_last_run_and_the_run_its_flag(tmp_path):
    """A set's last recorded result wins; a run is exact while every set it loaded is, and a
    failed run is not exact whatever its sets said."""
    h = Harness(tmp_path)
    claims = SetResult(CLAIMS.name, "snapshot", 4, 0)
    wrong = SetResult(
        INSURANCE_VERIFICATIONS.name,
        "snapshot",
        20,
        9,
        failed_checks=("reconciled_with_source",),
        warned_checks=("read_whole_recently",),
        staleness_hours=30.5,
    )
    for run_id, results in (("run-1", [claims, wrong]), ("run-2", [claims])):
        for result in results:
            with h.wh.transaction():
                h.wh.record_set_result(run_id, result)
                checks = [(name, False, True) for name in result.failed_checks]
                checks += [(name, False, False) for name in result.warned_checks]
                h.wh.record_checks(run_id, result.entity, [*checks, ("count", True, True)])
    h.wh.record_set_result("run-2", claims)  # a step tried again: still one row
    for run_id, status in (("run-1", SUCCESS), ("run-2", SUCCESS), ("run-3", FAILED)):
        h.wh.end_run(RunEnding(run_id, status, None, message="extract_patients: refused"))
    health = {
        r[0]: r[1:]
        for r in h.rows(
            "SELECT entity, exact, unreconciled, failed_checks, warned_checks, staleness_hours, "
            "run_id FROM analytics.sync_health"
        )
    }
    assert health == {
        "Claims": (True, 0, [], [], None, "run-2"),
        "InsuranceVerifications": (
            False,
            9,
            ["reconciled_with_source"],
            ["read_whole_recently"],
            30.5,
            "run-1",
        ),
    }
    runs = dict(h.rows('SELECT "run_id", "exact" FROM "ops"."sync_runs"'))
    assert runs == {"run-1": False, "run-2": True, "run-3": False}
    states = {s.entity: s.last_result for s in h.wh.status()}
    ended = states["InsuranceVerifications"]
    assert ended == replace(wrong, run_id="run-1", recorded_at=ended.recorded_at)
    assert states["Patients"] is None and states["Claims"].exact
    h.close()


def test_models_read_the_sets_they_join_through_refs_too():
    found = {m.name: m for m in transform_models()}
    assert set(found) == MODELS
    assert found["prescription_claims"].reads == ("Claims", "Prescriptions")
    assert found["prescription_summary"].reads == (
        "Branches",
        "Claims",
        "InsuranceVerifications",
        "Patients",
        "Physicians",
        "Prescriptions",
    )
    assert found["prescription_summary"].description.startswith("One row per live prescription")


def test_broken_references_lists_every_reference_the_checks_count(tmp_path):
    """One live record per reference whose target is missing: each is listed, under the
    reference the check `references_found` counts it by (its list is the catalogue's)."""
    checked = {
        (ref.source.name, ref.navigation.local)
        for refs in references_by_table().values()
        for ref in refs
    }
    generated = {(s.name, local) for s, local, _, _ in dbt_catalogue.references()}
    assert generated == checked and len(checked) == 10
    h = Harness(tmp_path)
    for name in sorted({s for s, _ in checked}):
        ent = BY_NAME[name]
        dangling = {
            local: 999 if ent.field(local).type is Edm.INT32 else "999"  # as the spec types it
            for s, local in checked
            if s == name
        }
        h.sync(ent, [record(ent, 1, **dangling)])
    models.build(h.path)
    listed = h.rows("SELECT entity, reference, parent_id FROM analytics.broken_references")
    assert sorted((e, r) for e, r, _ in listed) == sorted(checked)
    assert {p for _, _, p in listed} == {"999"}
    h.close()


def test_an_unknown_physician_is_null_never_an_empty_string(tmp_path):
    h = Harness(tmp_path)
    h.sync(PHYSICIANS, [record(PHYSICIANS, 21, id="21", first_name=None, last_name=None)])
    h.sync(
        PRESCRIPTIONS,
        [
            record(PRESCRIPTIONS, 1, referring_physician_id="404", primary_care_physician_id="21"),
            record(PRESCRIPTIONS, 2, referring_physician_id=None, primary_care_physician_id=None),
        ],
    )
    models.build(h.path)
    names = h.rows(
        "SELECT referring_physician, primary_care_physician FROM analytics.prescription_summary"
    )
    assert names == [(None, None), (None, None)]
    h.close()


def test_each_model_is_a_table_equal_to_its_select_with_a_comment(linked):
    kinds = linked.rows(
        "SELECT table_name, comment FROM duckdb_tables() WHERE schema_name = 'analytics'"
    )
    assert {name for name, _ in kinds} == MODELS | {CHANGES_TABLE}
    assert all(comment for _, comment in kinds)
    views = linked.rows("SELECT view_name FROM duckdb_views() WHERE schema_name = 'analytics'")
    assert {name for (name,) in views} == set(ANALYTICS_VIEWS)  # the DDL's own, no model
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        assert table == query and table, name
    built = dict(linked.rows('SELECT "name", "rows" FROM "ops"."models"'))
    assert built == {name: len(rows) for name, (rows, _) in analytics_rows(linked.wh.con).items()}
