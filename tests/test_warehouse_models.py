"""The analytics models link prescriptions, claims, verifications, patients and physicians;
each is a table built from its SELECT, all in one transaction, and a publication never copies
them older than the clinical tables they read."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from decimal import Decimal

import duckdb
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
from tests.warehouse_records import Harness, analytics_rows, record
from warehouse import models
from warehouse.ddl import DDL_VIEWS
from warehouse.load import SetResult
from warehouse.models import Model, parse
from warehouse.publish import publish
from warehouse.runs import FAILED, SUCCESS, RunEnding


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
    assert list(h.wh.refresh_models()) == [
        "prescription_claims",
        "prescription_verifications",
        "prescription_summary",
        "broken_references",
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
    h.wh.refresh_models()
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


def test_models_are_named_by_their_file_and_read_the_tables_they_join():
    found = {m.name: m for m in models.models()}
    assert list(found) == [
        "prescription_claims",
        "prescription_verifications",
        "prescription_summary",
        "broken_references",
    ]
    assert {"prescriptions", "claims"} <= {e.table for e in found["prescription_claims"].sources}
    assert found["prescription_summary"].description.endswith("to first claim.")
    model = parse(
        "07_x.sql",
        "-- One row per thing: its parts, and the days from\n-- one step to the next.\n"
        "-- More detail.\nSELECT * FROM clinical.claims;\n",
    )
    assert (model.name, [e.name for e in model.sources], model.sql[-20:]) == (
        "x",
        ["Claims"],
        "FROM clinical.claims",
    )
    assert model.description == (
        "One row per thing: its parts, and the days from one step to the next."
    )
    for name, sql in (("x.sql", "SELECT 1"), ("01_x.sql", " ;\n")):
        with pytest.raises(ValueError, match=r"NN_<name>|empty"):
            parse(name, sql)


def test_each_model_is_a_table_equal_to_its_select_with_a_comment(linked):
    kinds = linked.rows(
        "SELECT table_name, comment FROM duckdb_tables() WHERE schema_name = 'analytics'"
    )
    assert {name for name, _ in kinds} == {m.name for m in models.models()}
    assert all(comment for _, comment in kinds)
    views = linked.rows("SELECT view_name FROM duckdb_views() WHERE schema_name = 'analytics'")
    assert {name for (name,) in views} == DDL_VIEWS  # the DDL's own (sync_health), no model
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        assert table == query and table, name
    built = dict(linked.rows('SELECT "name", "rows" FROM "ops"."models"'))
    assert built == {name: len(rows) for name, (rows, _) in analytics_rows(linked.wh.con).items()}


def test_a_failing_model_leaves_none_half_built_and_every_model_stale(linked, monkeypatch):
    """The previous build is dropped before the next (its blocks reused: warehouse/vacuum.py);
    the models built before a failure roll back with it, so none is left to publish and a
    publication builds them first (analysts keep the night before until then)."""
    linked.sync(CLAIMS, [record(CLAIMS, 5, prescription_id=100, total_claim_amount="7.00")], day=2)
    broken = Model(
        "zz_broken", "Reads a table that is not there.", "SELECT * FROM clinical.nope", ()
    )
    real = models.models()
    monkeypatch.setattr(models, "models", lambda: [*real, broken])
    with pytest.raises(Exception, match="nope"):
        linked.wh.refresh_models()
    assert (
        linked.rows("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'analytics'") == []
    )
    assert linked.rows('SELECT * FROM "ops"."models"') == []  # forgotten with the tables
    monkeypatch.setattr(models, "models", lambda: real)
    assert sorted(linked.wh.stale_models()) == sorted(m.name for m in real)


def test_views_of_an_older_version_and_removed_models_give_way_to_the_tables(harness):
    harness.rows("CREATE VIEW analytics.prescription_claims AS SELECT 1 AS x")
    harness.rows("CREATE TABLE analytics.retired_model AS SELECT 1 AS x")
    harness.wh.refresh_models()
    held = harness.rows(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'analytics' "
        "UNION ALL SELECT view_name FROM duckdb_views() WHERE schema_name = 'analytics'"
    )
    assert sorted(n for (n,) in held) == sorted([*(m.name for m in models.models()), *DDL_VIEWS])


def test_a_load_since_the_build_makes_the_models_that_read_it_stale_and_publish_builds_them(
    linked, tmp_path
):
    assert linked.wh.stale_models() == []
    linked.sync(CLAIMS, [record(CLAIMS, 5, prescription_id=100, total_claim_amount="7.00")], day=2)
    # Verifications read no claim; the three that do are older than the load.
    assert linked.wh.stale_models() == [
        "prescription_claims",
        "prescription_summary",
        "broken_references",
    ]
    linked.close()
    published = tmp_path / "published.duckdb"
    publish(linked.path, published)
    with duckdb.connect(str(published), read_only=True) as con:
        for name, (table, query) in analytics_rows(con).items():
            assert table == query, name
        amounts = con.execute(
            "SELECT total_claim_amount FROM analytics.prescription_claims WHERE claim_id = 5"
        ).fetchall()
        assert amounts == [(Decimal("7.00"),)]
        assert models.stale(con, models.models()) == []


def test_new_sql_or_a_new_schema_makes_a_model_stale(linked):
    changed = [
        Model(m.name, m.description, m.sql + " LIMIT 1", m.sources)
        if m.name == "prescription_verifications"
        else m
        for m in models.models()
    ]
    assert models.stale(linked.wh.con, changed) == ["prescription_verifications"]
    linked.rows('UPDATE "ops"."schema_version" SET "applied_at" = now() + INTERVAL 1 MINUTE')
    assert len(linked.wh.stale_models()) == 4
