"""Tenants as Dagster partitions: with a tenants file every asset is partitioned by `tenant`, a
dynamic dimension whose keys are the tenants' names, kept in step with the file by the
`tenant_partitions` sensor (and by `clinical-sync tenants add` and `sync --tenant`).

A run is one tenant's: its partition key chooses the credentials, the lake and the warehouse
(pipelines/resources.py); the instance's run queue allows one run per partition key at a time
(dagster.yaml's tag limit on `dagster/partition`). The nightly schedule asks for one run per
tenant.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import (
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    RunRequest,
    ScheduleDefinition,
    SensorDefinition,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from pipelines import home, tenants

TENANT_DIMENSION = "tenant"
TENANTS = DynamicPartitionsDefinition(name=TENANT_DIMENSION)
PARTITION_TAG = "dagster/partition"  # the tag Dagster gives a partition's run
SENSOR_SECONDS = 30
# A tenant's nightly run executes its steps in its run's process: a process per step costs
# about nine times the CPU (docs/SIZING.md), and within a run the pools already take one
# extraction and one DuckDB writer at a time, so separate processes buy little overlap.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}
AssetJob = Any  # what `define_asset_job` returns (Dagster does not export its class)


def tenant_of(context: Any) -> str | None:
    """The run's tenant (its partition key); None when the assets are not partitioned."""
    return context.partition_key if context.has_partition_key else None


def run_place(tags: Mapping[str, str]) -> tuple[tenants.Tenant | None, str]:
    """A finished run's tenant (None: the one customer, or a run of no partition) and the
    warehouse it wrote: where the sensors that conclude a run mark or report it. ConfigError
    when the tenants file is broken or no longer holds the run's tenant."""
    path, name = home.tenants_file(), tags.get(PARTITION_TAG)
    tenant = tenants.load(path).get(name) if path is not None and name is not None else None
    return tenant, str(tenant.warehouse) if tenant else home.warehouse_path()


def changes(names: Sequence[str], held: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tenant partitions to add and to delete so that `held` matches the file's `names`."""
    return [n for n in names if n not in held], [h for h in held if h not in names]


def keep_in_step(instance: DagsterInstance, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Add and delete tenant partitions now (the CLI's way; the sensor asks Dagster to)."""
    added, gone = changes(names, instance.get_dynamic_partitions(TENANT_DIMENSION))
    if added:
        instance.add_dynamic_partitions(TENANT_DIMENSION, added)
    for name in gone:
        instance.delete_dynamic_partition(TENANT_DIMENSION, name)
    return added, gone


def tenant_partitions_sensor(tenants_file: Path) -> SensorDefinition:
    @sensor(
        name="tenant_partitions",
        minimum_interval_seconds=SENSOR_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            f"Keeps the tenant partitions in step with the tenants file ({tenants_file}): a "
            "tenant added there gets its partition, one removed loses it"
        ),
    )
    def tenant_partitions(context) -> SensorResult | SkipReason:
        names = tenants.load(tenants_file).names
        added, gone = changes(names, context.instance.get_dynamic_partitions(TENANT_DIMENSION))
        if not added and not gone:
            return SkipReason(f"the {len(names)} tenant partitions match {tenants_file}")
        context.log.info(f"tenant partitions: adding {added or 'none'}, deleting {gone or 'none'}")
        return SensorResult(
            dynamic_partitions_requests=[
                TENANTS.build_add_request(added),
                TENANTS.build_delete_request(gone),
            ]
        )

    return tenant_partitions


def nightly_per_tenant(
    job: AssetJob,
    tenants_file: Path,
    *,
    share: Sequence[str] | None,
    name: str,
    cron: str,
    timezone: str,
    description: str,
) -> ScheduleDefinition:
    """The nightly schedule with a tenants file: one run per tenant that has its partition,
    each the tenant's own, in process (queued; one per tenant at a time, the queue's global
    maximum). With several workers, each code location starts the runs of its `share`."""

    @schedule(
        name=name,
        job=job,
        cron_schedule=cron,
        execution_timezone=timezone,
        default_status=DefaultScheduleStatus.STOPPED,
        description=description,
    )
    def nightly(context) -> Iterator[RunRequest]:
        held = set(context.instance.get_dynamic_partitions(TENANT_DIMENSION))
        when = context.scheduled_execution_time.isoformat()
        for tenant in tenants.load(tenants_file):
            if share is not None and tenant.name not in share:
                continue  # another worker's tenant
            if tenant.name not in held:
                context.log.warning(
                    f"tenant {tenant.name!r} has no partition yet (the tenant_partitions sensor "
                    "adds it within a minute, or `clinical-sync tenants add`); not run tonight"
                )
                continue
            yield RunRequest(
                run_key=f"{tenant.name}@{when}", partition_key=tenant.name, run_config=IN_PROCESS
            )

    return nightly
