"""The analytics models (dbt) through real runs: a sandbox, the Dagster assets, the published
file, and the CLI an operator runs.

After every run the published models equal their SELECT over the published clinical tables;
the models step runs after the loads and before the publication, and builds a model only when
a table it reads changed; an analytics team's own project (CLINICAL_DBT_PROJECT) lands in the
published `analytics` schema; a model that fails costs nothing of the night's clinical tables,
and the run says which model failed.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterEventType, DagsterInstance

from connectors.clinical_records.catalogue import CLAIMS, ENTITY_SETS
from connectors.sandbox.server import SandboxServer
from pipelines.runner import SyncReport, sync
from tests.truth import canonical, live_rows
from tests.warehouse_records import PER_BRANCH, analytics_rows, project_copy
from warehouse.dbt_project import PROJECT_VARIABLE

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).with_name("clinical-sync"))


def environment(server: SandboxServer, root: Path, **extra: str) -> dict[str, str]:
    return {
        **server.env(),
        "CLINICAL_RATE_LIMIT": "1000",
        "CLINICAL_BURST": "200",
        "CLINICAL_LIMITER_PATH": str(root / "ratelimit.sqlite"),
        **extra,
    }


def run(server: SandboxServer, root: Path, **options: object) -> SyncReport:
    env = environment(server, root, **options.pop("env", {}))  # type: ignore[arg-type]
    return sync(
        env,
        lake_root=str(root / "lake"),
        warehouse_path=str(root / "warehouse.duckdb"),
        **options,  # type: ignore[arg-type]
    )


def query(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql).fetchall()


def published(root: Path) -> dict[str, tuple[list[str], list[str]]]:
    with duckdb.connect(str(root / "warehouse.duckdb"), read_only=True) as con:
        return analytics_rows(con)


def advance(server: SandboxServer) -> None:
    with server.store.lock:
        server.store.advance(
            seconds=86400, insert_fraction=0.05, update_fraction=0.05, delete_fraction=0.05
        )


def assert_clinical_equals_the_source(server: SandboxServer, root: Path) -> None:
    with server.store.lock:
        truth = server.store.ground_truth()
    for ent in ENTITY_SETS:
        assert live_rows(root / "warehouse.duckdb", ent) == canonical(ent, truth[ent.name]), ent


def test_published_models_equal_their_select_after_every_run(fresh_sandbox, tmp_path):
    for night in range(3):  # a full sync, then nights of inserts, updates and deletes
        if night:
            advance(fresh_sandbox)
        assert run(fresh_sandbox, tmp_path).success
        for name, (table, select) in published(tmp_path).items():
            assert table == select, (night, name)
        stale = query(
            tmp_path / "warehouse.duckdb", "SELECT name FROM analytics.model_health WHERE stale"
        )
        assert stale == []


def test_models_run_after_the_loads_before_the_publication_and_only_when_needed(
    fresh_sandbox, tmp_path
):
    with DagsterInstance.ephemeral() as instance:

        def steps(report: SyncReport) -> tuple[list[str], set[str]]:
            """The run's steps in the order they started, and the models it materialized."""
            logs = instance.all_logs(report.run_id)
            started = [
                e.dagster_event.step_key
                for e in logs
                if e.dagster_event and e.dagster_event.event_type is DagsterEventType.STEP_START
            ]
            built = {
                e.dagster_event.asset_key.path[-1]
                for e in logs
                if e.dagster_event
                and e.dagster_event.event_type is DagsterEventType.ASSET_MATERIALIZATION
                and e.dagster_event.asset_key.path[0] == "analytics"
            }
            return started, built

        first = run(fresh_sandbox, tmp_path, instance=instance)
        order, built = steps(first)
        loads = [order.index(s) for s in order if s.startswith("clinical__")]
        assert max(loads) < order.index("analytics_models") < order.index("published__warehouse")
        assert built == set(published(tmp_path))

        again = run(fresh_sandbox, tmp_path, instance=instance)  # nothing changed at the source
        assert again.success and steps(again)[1] == set()

        with fresh_sandbox.store.lock:  # a claim changes, nothing else
            fresh_sandbox.store.drift(CLAIMS, inserts=0, updates=1, deletes=0, rng=random.Random(3))
        claims = run(fresh_sandbox, tmp_path, instance=instance)
        assert steps(claims)[1] == {
            "prescription_claims",
            "prescription_summary",
            "broken_references",
        }
        for name, (table, select) in published(tmp_path).items():
            assert table == select, name


def test_an_analytics_teams_own_project_is_built_and_published(fresh_sandbox, tmp_path):
    project = project_copy(tmp_path, claims_per_branch=PER_BRANCH)
    report = run(fresh_sandbox, tmp_path, env={PROJECT_VARIABLE: str(project)})
    assert report.success, report.failure
    counted = dict(
        query(tmp_path / "warehouse.duckdb", "SELECT * FROM analytics.claims_per_branch")
    )
    with fresh_sandbox.store.lock:
        claims = canonical(CLAIMS, fresh_sandbox.store.ground_truth()[CLAIMS.name])
    assert counted == Counter(c["billing_branch_id"] for c in claims.values())
    # Our models come with it, as the copy holds them.
    assert {"prescription_summary", "claims_per_branch"} <= {
        n
        for (n,) in query(tmp_path / "warehouse.duckdb", "SELECT name FROM analytics.model_health")
    }


def test_a_model_that_fails_costs_nothing_of_the_nights_clinical_tables(fresh_sandbox, tmp_path):
    """The operator's view: `clinical-sync sync` exits non-zero naming the model; the clinical
    tables publish equal to the source, the other models too; the failed model's last table
    stays, and the published file says it is stale and why."""
    good = run(fresh_sandbox, tmp_path, env={PROJECT_VARIABLE: str(project_copy(tmp_path))})
    assert good.success, good.failure
    advance(fresh_sandbox)
    project = project_copy(
        tmp_path / "broken", claims_per_branch=PER_BRANCH.replace("count(*)", "count(nope)")
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLINICAL_")},
        **environment(fresh_sandbox, tmp_path),
        PROJECT_VARIABLE: str(project),
        "WAREHOUSE_PATH": str(tmp_path / "warehouse.duckdb"),
        "LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    done = subprocess.run(
        [CLI, "sync"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "claims_per_branch" in output and "Binder Error" in output, output[-3000:]
    assert_clinical_equals_the_source(fresh_sandbox, tmp_path)
    for name, (table, select) in published(tmp_path).items():
        assert table == select, name  # ours, built from the night's tables
    (health,) = query(
        tmp_path / "warehouse.duckdb",
        "SELECT stale, failure FROM analytics.model_health WHERE name = 'claims_per_branch'",
    )
    assert health == (True, "build failed: Binder Error")
    # The run's row, written by its publication into the copy it published: failed, the model
    # named, not exact (the exit status says the same).
    (last,) = query(
        tmp_path / "warehouse.duckdb",
        'SELECT "status", "exact", "message" FROM "ops"."sync_runs" '
        'ORDER BY "finished_at" DESC LIMIT 1',
    )
    assert last == (
        "failed",
        False,
        "models failed: claims_per_branch (build failed: Binder Error)",
    )

    status = subprocess.run(
        [CLI, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "claims_per_branch" in status.stdout and "Binder Error" in status.stdout
