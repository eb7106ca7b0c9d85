"""When the analytics models are built, and what a build keeps: only when a table a model reads
changed, again whole when its SQL or the schema is new, the rows of what changed on other
nights; a model that fails keeps its last table and says so, and a publication names the models
older than the tables they read."""

from __future__ import annotations

import shutil
from dataclasses import replace
from decimal import Decimal

import duckdb

from connectors.clinical_records.catalogue import (
    CLAIMS,
    PRESCRIPTIONS,
)
from tests.warehouse_records import MODELS, analytics_rows, record, transform_models
from warehouse import dbt_project, models
from warehouse.publish import publish


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
