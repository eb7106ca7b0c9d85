"""The analytics tables through real runs: a sandbox, the Dagster assets, the published file.

After every run the published models equal their SELECT over the published clinical tables
(deletes and a second run included), and a run whose models step fails publishes nothing:
analysts keep the last night's models and tables, consistent with each other.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from connectors.sandbox.server import SandboxServer
from pipelines.runner import SyncReport, sync
from tests.warehouse_records import analytics_rows
from warehouse import models
from warehouse.models import Model

pytestmark = pytest.mark.e2e


def run(server: SandboxServer, root: Path) -> SyncReport:
    env = {
        **server.env(),
        "CLINICAL_RATE_LIMIT": "1000",
        "CLINICAL_BURST": "200",
        "CLINICAL_LIMITER_PATH": str(root / "ratelimit.sqlite"),
    }
    return sync(env, lake_root=str(root / "lake"), warehouse_path=str(root / "warehouse.duckdb"))


def published(root: Path) -> dict[str, tuple[list[str], list[str]]]:
    with duckdb.connect(str(root / "warehouse.duckdb"), read_only=True) as con:
        return analytics_rows(con)


def live_claims_of_live_prescriptions(server: SandboxServer) -> set[int]:
    with server.store.lock:
        truth = server.store.ground_truth()
    prescriptions = {str(p["id"]) for p in truth["Prescriptions"]}
    return {c["id"] for c in truth["Claims"] if str(c["prescription_id"]) in prescriptions}


def joined_claims(root: Path) -> set[int]:
    with duckdb.connect(str(root / "warehouse.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT claim_id FROM analytics.prescription_claims").fetchall()
    return {i for (i,) in rows}


def advance(server: SandboxServer) -> None:
    with server.store.lock:
        server.store.advance(
            seconds=86400, insert_fraction=0.05, update_fraction=0.05, delete_fraction=0.05
        )


def test_published_models_equal_their_select_after_every_run(fresh_sandbox, tmp_path):
    for night in range(3):  # a full sync, then nights of inserts, updates and deletes
        if night:
            advance(fresh_sandbox)
        assert run(fresh_sandbox, tmp_path).success
        for name, (table, query) in published(tmp_path).items():
            assert table == query, (night, name)
        assert joined_claims(tmp_path) == live_claims_of_live_prescriptions(fresh_sandbox)


def test_a_run_whose_models_step_fails_publishes_nothing(fresh_sandbox, tmp_path, monkeypatch):
    assert run(fresh_sandbox, tmp_path).success
    last_night = published(tmp_path)
    advance(fresh_sandbox)
    real = models.models()
    broken = Model(
        "zz_broken", "Reads a table that is not there.", "SELECT * FROM clinical.nope", ()
    )
    monkeypatch.setattr(models, "models", lambda: [*real, broken])

    failed = run(fresh_sandbox, tmp_path)
    assert not failed.success and failed.failed_steps == ["analytics_models"]
    # Models and clinical tables as the last successful run published them, together.
    assert published(tmp_path) == last_night
    assert joined_claims(tmp_path) != live_claims_of_live_prescriptions(fresh_sandbox)

    monkeypatch.undo()
    assert run(fresh_sandbox, tmp_path).success
    for name, (table, query) in published(tmp_path).items():
        assert table == query, name
    assert joined_claims(tmp_path) == live_claims_of_live_prescriptions(fresh_sandbox)
