"""A failed run is marked `failed` in `ops.sync_runs`, whoever launched it.

The CLI records its own runs (pipelines/runner.py); runs launched from the Dagster UI or the
schedule are recorded by the sensor below (the daemon of `make dev` runs it), in the warehouse
of the run's tenant (pipelines/run_record.py).
"""

from __future__ import annotations

import os

from dagster import DefaultSensorStatus, RunFailureSensorContext, run_failure_sensor

from connectors.clinical_records.errors import ConfigError
from pipelines import home
from pipelines.partitions import run_place
from pipelines.run_record import Place, failed, source_of
from pipelines.verdict import first_failure


@run_failure_sensor(
    name="mark_failed_runs",
    default_status=DefaultSensorStatus.RUNNING,
    description="Marks runs launched from the UI or the schedule as failed in ops.sync_runs",
)
def mark_failed_runs(context: RunFailureSensorContext) -> None:
    run = context.dagster_run
    message = first_failure(context.get_step_failure_events())
    try:
        tenant, path = run_place(run.tags)
    except ConfigError as error:
        context.log.warning(f"run {run.run_id} of a tenant failed; not marked: {error}")
        return
    if tenant is not None:
        place = Place(path, str(tenant.lake), (tenant.base_url, tenant.customer), tenant.name)
    else:
        place = Place(path, home.lake_root(), source_of(os.environ))
    failed(context.instance, run.run_id, place, message)
