"""The analytics views link prescriptions, claims, verifications, patients and physicians."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENT_TYPES,
    APPOINTMENTS,
    BRANCHES,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PHYSICIANS,
    PRESCRIPTIONS,
)
from tests.warehouse_records import Harness, record
from warehouse.load import LoadResult, SetResult


@pytest.fixture
def linked(tmp_path):
    h = Harness(tmp_path)
    h.sync(PATIENTS, [record(PATIENTS, 10, id="10", first_name="Zoë", last_name="O'Brien")])
    h.sync(BRANCHES, [record(BRANCHES, 3, name="North")])
    h.sync(
        PHYSICIANS,
        [
            record(PHYSICIANS, 21, id="21", first_name="Ada", last_name="Ref"),
            record(PHYSICIANS, 22, id="22", first_name="Bo", last_name="Care"),
        ],
    )
    h.sync(APPOINTMENT_TYPES, [record(APPOINTMENT_TYPES, 1)])
    h.sync(
        PRESCRIPTIONS,
        [
            record(
                PRESCRIPTIONS,
                100,
                patient_id=10,
                branch_id=3,
                referring_physician_id=21,
                primary_care_physician_id=22,
                prescription_date="2026-01-01",
                delivered_on="2026-01-11T15:00:00-05:00",
            ),
            record(PRESCRIPTIONS, 101, patient_id=10, delivered_on=None),
        ],
    )
    claim = {
        "total_claim_amount": "0.10",
        "total_claim_paid": "0.05",
        "prescription_id": 100,
        "billing_branch_id": 3,
    }
    h.sync(
        CLAIMS,
        [
            record(CLAIMS, 1, **claim, date_of_service="2026-01-20"),
            record(
                CLAIMS, 2, **{**claim, "total_claim_amount": "0.20"}, date_of_service="2026-01-15"
            ),
            record(CLAIMS, 3, prescription_id=999, billing_branch_id=3),
            record(CLAIMS, 4, **{**claim, "total_claim_amount": "5.00"}),
        ],
        snapshot=True,
    )
    # Claim 4 is deleted at the source: a snapshot without it.
    h.sync(
        CLAIMS,
        [
            record(CLAIMS, 1, **claim, date_of_service="2026-01-20"),
            record(
                CLAIMS, 2, **{**claim, "total_claim_amount": "0.20"}, date_of_service="2026-01-15"
            ),
            record(CLAIMS, 3, prescription_id=999, billing_branch_id=3),
        ],
        day=1,
        snapshot=True,
    )
    h.sync(
        INSURANCE_VERIFICATIONS,
        [
            record(
                INSURANCE_VERIFICATIONS,
                7,
                prescription_id=100,
                verified_on="2026-01-02",
                network_type="OUT",
            ),
            record(
                INSURANCE_VERIFICATIONS,
                8,
                prescription_id=100,
                verified_on="2026-01-05",
                network_type="IN",
                pre_auth_necessary=True,
            ),
            record(INSURANCE_VERIFICATIONS, 9, prescription_id=555),
        ],
    )
    h.sync(
        APPOINTMENTS,
        [
            record(
                APPOINTMENTS, 1, patient_id="10", prescription_id="100", appointment_type_id="app-1"
            ),
            record(
                APPOINTMENTS,
                2,
                patient_id="404",
                prescription_id="100",
                appointment_type_id="app-1",
            ),
        ],
    )
    assert h.wh.refresh_models() == [
        "01_prescription_claims",
        "02_prescription_verifications",
        "03_prescription_summary",
        "04_broken_references",
        "05_sync_health",
    ]
    yield h
    h.close()


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
    ]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "America/Los_Angeles"])
def test_delivery_date_is_the_date_as_written_in_any_readers_time_zone(tmp_path, zone):
    """delivered_on is free text; a date-time's date is the clinic's day as written, not
    the day the offset and the analyst's TimeZone setting would make of it."""
    h = Harness(tmp_path)
    written = {
        1: "2026-01-11T23:30:00-05:00",
        2: "2026-01-11T00:30:00+09:00",
        3: "2026-01-11 08:00",
        4: "2026-01-11",
        5: "left at the door",
    }
    h.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, k, delivered_on=v) for k, v in written.items()])
    h.wh.refresh_models()
    h.rows(f"SET TimeZone = '{zone}'")
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
                h.wh.add_to_run(run_id, [result.entity], LoadResult())
                h.wh.record_set_result(run_id, result)
    h.wh.record_set_result("run-2", claims)  # a step tried again: still one row
    h.wh.fail_run("run-3", "extract_patients: refused")
    h.wh.refresh_models()
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
