"""A failed run reads `failed` in ops.sync_runs, also when the UI or the schedule launched it."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, build_run_status_sensor_context

from pipelines.run_failures import mark_failed_runs
from pipelines.runner import sync
from warehouse.load import Warehouse
from warehouse.publish import working_path


@pytest.mark.integration
def test_the_sensor_marks_a_failed_run(sandbox, tmp_path, monkeypatch):
    warehouse = tmp_path / "wh.duckdb"
    with Warehouse(warehouse) as wh:
        wh.ensure_schema()
    env = {
        **sandbox.env(),
        "CLINICAL_CLIENT_SECRET": "wrong-secret-4b1e",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "limiter.sqlite"),
    }
    with DagsterInstance.ephemeral() as instance:
        _check_the_sensor(instance, env, warehouse, tmp_path, monkeypatch)


def _check_the_sensor(instance, env, warehouse, tmp_path, monkeypatch):
    report = sync(
        env,
        lake_root=str(tmp_path / "lake"),
        warehouse_path=str(tmp_path / "elsewhere.duckdb"),  # the CLI's own marking misses it
        only=["Branches"],
        instance=instance,
        log_level="ERROR",
    )
    assert not report.success
    run = instance.get_run_by_id(report.run_id)
    failure = next(
        e
        for e in instance.all_logs(report.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    )
    context = build_run_status_sensor_context(
        sensor_name="mark_failed_runs",
        dagster_instance=instance,
        dagster_run=run,
        dagster_event=failure.dagster_event,
    ).for_run_failure()

    for name, value in {**env, "WAREHOUSE_PATH": str(warehouse)}.items():
        monkeypatch.setenv(name, value)  # what the daemon's environment holds
    mark_failed_runs(context)

    # A failed run publishes nothing: the mark is in the working copy, published by the next run.
    with Warehouse(working_path(warehouse), read_only=True) as wh:
        rows = wh.con.execute(
            'SELECT "run_id", "status", "message" FROM "ops"."sync_runs"'
        ).fetchall()
    assert [(run_id, status) for run_id, status, _ in rows] == [(report.run_id, "failed")]
    assert "invalid_client" in rows[0][2] and "wrong-secret-4b1e" not in rows[0][2]
