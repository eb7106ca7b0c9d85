"""The analytics models (dbt, transform/) link prescriptions, claims, verifications, patients
and physicians; each is a table built from its SELECT, only when a table it reads changed;
a model that fails keeps its last table and says so, and a publication names the models older
than the tables they read."""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import date
from decimal import Decimal

import duckdb
import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENT_TYPES,
    APPOINTMENTS,
    BRANCHES,
    BY_NAME,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PHYSICIANS,
    PRESCRIPTIONS,
    Edm,
)
from pipelines.checks import references_by_table
from tests.warehouse_records import Harness, analytics_rows, record
from warehouse import dbt_catalogue, dbt_project, models
from warehouse.ddl import ANALYTICS_VIEWS, CHANGES_TABLE
from warehouse.load import SetResult
from warehouse.publish import publish
from warehouse.runs import FAILED, SUCCESS, RunEnding

MODELS = {
    "prescription_claims",
    "prescription_verifications",
    "prescription_summary",
    "broken_references",
}


def transform_models() -> list[models.Model]:
    return models.models(dbt_project.manifest_json(dbt_project.prepare()))


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
    assert set(models.build(h.path).built) == MODELS
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


def test_nothing_changed_nothing_built_and_a_change_builds_the_models_that_read_it(linked):
    again = models.build(linked.path)
    assert again.built == {} and set(again.reused) == MODELS
    linked.sync(CLAIMS, [record(CLAIMS, 5, prescription_id=100, total_claim_amount="7.00")], day=2)
    # Verifications read no claim; the three that do are older than the load.
    assert {m.name for m in models.stale(linked.wh.con, transform_models())} == {
        "prescription_claims",
        "prescription_summary",
        "broken_references",
    }
    built = models.build(linked.path)
    assert set(built.built) == MODELS - {"prescription_verifications"}
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        assert table == query, name


def test_new_sql_or_a_new_schema_makes_a_model_stale(linked):
    found = transform_models()
    changed = [
        replace(m, checksum="other") if m.name == "prescription_verifications" else m for m in found
    ]
    assert [m.name for m in models.stale(linked.wh.con, changed)] == ["prescription_verifications"]
    linked.rows('UPDATE "ops"."schema_version" SET "applied_at" = now() + INTERVAL 1 MINUTE')
    assert len(models.stale(linked.wh.con, found)) == 4


def test_a_view_of_an_older_version_gives_way_to_the_table(harness):
    harness.rows("CREATE VIEW analytics.prescription_claims AS SELECT 1 AS x")
    models.build(harness.path)
    (kind,) = harness.rows(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'analytics' "
        "AND table_name = 'prescription_claims'"
    )[0]
    assert kind == 1


def test_a_failing_model_keeps_its_table_says_so_and_the_others_build(linked, tmp_path):
    """A project with a model that reads a table that is not there: the build names it and
    its kind of error, the other models are built, and its last table stays, marked stale."""
    project = tmp_path / "project"
    shutil.copytree(dbt_project.DEFAULT_PROJECT, project, ignore=shutil.ignore_patterns("target"))
    ok = "SELECT id, total_claim_amount FROM {{ source('clinical', 'claims') }}"
    (project / "models" / "claim_amounts.sql").write_text(ok)
    built = models.build(linked.path, dbt_project.prepare(project))
    assert built.ok and "claim_amounts" in built.built
    before = linked.rows("SELECT * FROM analytics.claim_amounts ORDER BY ALL")

    (project / "models" / "claim_amounts.sql").write_text(ok.replace("id,", "no_such_column,"))
    linked.sync(CLAIMS, [record(CLAIMS, 5, prescription_id=100, total_claim_amount="7.00")], day=2)
    failed = models.build(linked.path, dbt_project.prepare(project))
    assert failed.failed == {"claim_amounts": "build failed: Binder Error"}
    assert set(failed.built) == MODELS - {"prescription_verifications"}
    assert linked.rows("SELECT * FROM analytics.claim_amounts ORDER BY ALL") == before
    health = linked.rows(
        "SELECT stale, changed_since_built, failure, failed_at > built_at "
        "FROM analytics.model_health WHERE name = 'claim_amounts'"
    )
    assert health == [(True, ["Claims"], "build failed: Binder Error", True)]


def test_publish_names_the_models_older_than_the_tables_they_read(linked, tmp_path):
    linked.sync(CLAIMS, [record(CLAIMS, 5, prescription_id=100, total_claim_amount="7.00")], day=2)
    linked.close()
    done = publish(linked.path, tmp_path / "published.duckdb")
    assert done.stale_models == ("broken_references", "prescription_claims", "prescription_summary")
    with duckdb.connect(str(done.path), read_only=True) as con:
        stale = con.execute("SELECT name FROM analytics.model_health WHERE stale ORDER BY 1")
        assert [n for (n,) in stale.fetchall()] == list(done.stale_models)


def test_a_night_builds_again_only_the_rows_of_what_changed_and_new_sql_builds_all(
    linked, tmp_path
):
    """The linked models are incremental (transform/macros/changed_records.sql): a row no
    change reached is left as it was, here one altered by hand to show it; the claim that
    moved to another prescription is in its new row, and both prescriptions' summaries are
    counted again. A project whose model SQL changed builds that model whole."""
    linked.rows(
        "UPDATE analytics.prescription_claims SET total_claim_paid = 999 WHERE claim_id = 2"
    )
    moved = {"total_claim_amount": "0.10", "prescription_id": 101, "billing_branch_id": 3}
    linked.sync(CLAIMS, [record(CLAIMS, 1, **moved, date_of_service="2026-01-20")], day=2)
    assert models.build(linked.path).ok
    paid = dict(linked.rows("SELECT claim_id, total_claim_paid FROM analytics.prescription_claims"))
    assert paid[2] == 999  # untouched: no change reached claim 2 or prescription 100
    assert linked.rows(
        "SELECT prescription_id FROM analytics.prescription_claims WHERE claim_id = 1"
    ) == [("101",)]
    assert linked.rows(
        "SELECT prescription_id, claims, total_claim_amount::VARCHAR "
        "FROM analytics.prescription_summary ORDER BY 1"
    ) == [("100", 1, "0.200000000000"), ("101", 1, "0.100000000000")]
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        if name != "prescription_claims":
            assert table == query, name

    project = tmp_path / "project"
    shutil.copytree(dbt_project.DEFAULT_PROJECT, project, ignore=shutil.ignore_patterns("target"))
    sql = project / "models" / "analytics" / "prescription_claims.sql"
    sql.write_text(sql.read_text() + "-- another version of the SQL\n")
    assert models.build(linked.path, dbt_project.prepare(project)).ok
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        assert table == query, name


def test_an_incremental_build_that_fails_after_its_pre_hook_keeps_every_row(linked, tmp_path):
    """The pre-hook deletes the changed records' rows inside the build's transaction: a build
    that fails after it (here by design, on its incremental night) leaves the table whole."""
    project = tmp_path / "project"
    shutil.copytree(dbt_project.DEFAULT_PROJECT, project, ignore=shutil.ignore_patterns("target"))
    (project / "models" / "claim_copy.sql").write_text(
        "{{ config(materialized='incremental', pre_hook=\"{{ delete_changed_rows("
        "{'id': changed_ids('Claims', 'BIGINT')}) }}\") }}\n"
        "SELECT id, total_claim_amount FROM {{ source('clinical', 'claims') }}\n"
        "{% if is_incremental() %} WHERE id IN {{ changed_ids('Claims', 'BIGINT') }}\n"
        "    AND error('this build fails') IS NULL {% endif %}\n"
    )
    assert "claim_copy" in models.build(linked.path, dbt_project.prepare(project)).built
    before = linked.rows("SELECT * FROM analytics.claim_copy ORDER BY ALL")
    assert (1, Decimal("0.1")) in before
    linked.sync(CLAIMS, [record(CLAIMS, 1, prescription_id=100, total_claim_amount="7")], day=2)
    failed = models.build(linked.path, dbt_project.prepare(project))
    assert set(failed.failed) == {"claim_copy"}
    assert linked.rows("SELECT * FROM analytics.claim_copy ORDER BY ALL") == before


def test_a_parent_that_arrives_mends_its_childrens_broken_references(linked):
    """Claim 3 refers to prescription 999, never sent: a broken reference. The night that
    brings it builds again the rows of its children, and the reference is whole; when it
    goes again, so is the row."""
    broken = (
        "SELECT record_id FROM analytics.broken_references "
        "WHERE parent_entity = 'Prescriptions' AND parent_id = '999'"
    )
    assert linked.rows(broken) == [("3",)]
    linked.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, 999, patient_id=10)], day=2)
    assert models.build(linked.path).ok
    assert linked.rows(broken) == []
    linked.sync(PRESCRIPTIONS, [], day=3, deletes=["999"])
    assert models.build(linked.path).ok
    assert linked.rows(broken) == [("3",)]
    for name, (table, query) in analytics_rows(linked.wh.con).items():
        assert table == query, name
