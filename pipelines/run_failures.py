"""A failed run is marked `failed` in `ops.sync_runs`, whoever launched it.

Each load records its run as it commits, so without this a run that dies after its first
load would read `success` to an analyst. The CLI marks its own runs; runs launched from the
Dagster UI or the schedule are marked by the sensor below (the daemon of `make dev` runs it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from dagster import DefaultSensorStatus, RunFailureSensorContext, run_failure_sensor

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from pipelines.liveness import run_started_at
from pipelines.partitions import run_place
from sync.state import LOCK_WAIT_SECONDS
from warehouse.errors import WarehouseLocked
from warehouse.load import Warehouse
from warehouse.publish import working_copy, working_path

log = logging.getLogger(__name__)


def mark_failed(
    warehouse_path: str | Path,
    run_id: str,
    message: str,
    env: Mapping[str, str],
    started_at: datetime | None = None,
) -> bool:
    """Record the failure; False when there is no warehouse yet, it stays locked, or the run
    was for another source (the source guard refused it: its warehouse keeps no trace)."""
    if not (Path(warehouse_path).exists() or working_path(warehouse_path).exists()):
        return False  # failed before anything was loaded: no warehouse to tell
    try:
        settings = Settings.from_env(env)
    except ConfigError:
        return False  # the run never reached the service; nothing of it is in the warehouse
    try:  # into the working copy: a failed run publishes nothing
        path = working_copy(warehouse_path, wait=LOCK_WAIT_SECONDS)
        with Warehouse(path, wait=LOCK_WAIT_SECONDS) as wh:
            wh.ensure_schema()
            if wh.source() not in (None, (settings.base_url, settings.customer)):
                return False
            wh.fail_run(run_id, message, started_at)
    except WarehouseLocked:
        log.warning("run %s failed; the warehouse stayed locked, so ops.sync_runs says not", run_id)
        return False
    return True


def root_failures(events) -> list[tuple[str, Any]]:
    """Each failed step with the error underneath Dagster's wrapper (ours, without PHI)."""
    found = []
    for event in events:
        if event.is_step_failure and event.step_failure_data.error is not None:
            error = event.step_failure_data.error
            while error.cause is not None:  # Dagster's wrapper first, our error underneath
                error = error.cause
            found.append((event.step_key, error))
    return found


def first_failure(events) -> str:
    """The first step failure's message (the connector's errors carry no PHI)."""
    for step_key, error in root_failures(events):
        return f"{step_key}: {error.message.strip()}"
    return "the run failed"


@run_failure_sensor(
    name="mark_failed_runs",
    default_status=DefaultSensorStatus.RUNNING,
    description="Marks runs launched from the UI or the schedule as failed in ops.sync_runs",
)
def mark_failed_runs(context: RunFailureSensorContext) -> None:
    run_id = context.dagster_run.run_id
    message = first_failure(context.get_step_failure_events())
    started = run_started_at(context.instance, run_id)
    try:
        tenant, path = run_place(context.dagster_run.tags)
    except ConfigError as error:
        context.log.warning(f"run {run_id} of a tenant failed; not marked: {error}")
        return
    env = tenant.environment() if tenant is not None else os.environ
    mark_failed(path, run_id, message, env, started)
