"""Everything Dagster loads: `dagster dev -m pipelines.definitions`.

Jobs: `nightly_sync` (all assets, incremental, scheduled at 02:00 in CLINICAL_TIMEZONE),
`full_resync` (every set snapshotted: also the way to reset one set, by selecting its
assets), `documents_sync` (patient documents alone), `backfill_range` (re-read a date
range of the cursor sets without moving the watermark). Per-run options live in the
`sync_options` resource's launchpad config.

With a tenants file (CLINICAL_TENANTS_FILE) the same factory partitions every asset by tenant:
a run is one tenant's, the schedule starts one per tenant, the `tenant_partitions` sensor
keeps the partitions in step with the file (pipelines/partitions.py). Without one, one
customer from the environment, unpartitioned, as ever.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dagster import (
    AssetSelection,
    DagsterInvalidDefinitionError,
    DefaultScheduleStatus,
    Definitions,
    EnvVar,
    ScheduleDefinition,
    define_asset_job,
    multi_or_in_process_executor,
)

from connectors.clinical_records.catalogue import DOCUMENTS, ENTITY_SETS
from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.transport import LOGGER_NAME
from pipelines import home, tenants
from pipelines.alerts import alert_failed_runs, alert_inexact_runs
from pipelines.assets import build_assets, build_reference_checks
from pipelines.checks import with_freshness
from pipelines.documents_asset import CONTENT_KEY
from pipelines.keys import (
    BACKFILL_JOB,
    DOCUMENTS_JOB,
    FULL_JOB,
    NIGHTLY_JOB,
    POOL_TAG,
    PUBLISHED_KEY,
    lake_key,
    table_key,
)
from pipelines.partitions import TENANTS, AssetJob, nightly_per_tenant, tenant_partitions_sensor
from pipelines.publish_asset import build_publish_asset
from pipelines.resources import (
    ClinicalApiResource,
    LakeResource,
    SyncOptionsResource,
    WarehouseResource,
    tenant_resources,
)
from pipelines.run_failures import mark_failed_runs
from pipelines.table_schemas import with_column_schemas
from pipelines.webhook import webhook_from_env
from sync.budget import BUDGET_VARIABLE
from warehouse.private import private_umask

NIGHTLY_CRON = "0 2 * * *"
CRON_VARIABLE = "CLINICAL_NIGHTLY_CRON"
NIGHTLY_SCHEDULE = "nightly_sync_schedule"

# The code location's processes (code server, run and step workers) write the warehouse, the
# lake and Dagster's storage: every file they create is owner-only, whatever the umask.
private_umask()


def request_lines_to_stderr() -> None:
    """The connector's line per request goes to the Python logger, not into a run's event
    log (every line there is a row written to the instance); in a code location's processes
    nothing else prints it, so stderr does: the run's captured output in the UI."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


request_lines_to_stderr()


def timezone() -> str:
    """CLINICAL_TIMEZONE (an IANA name) for the nightly schedule; UTC when unset."""
    name = os.environ.get("CLINICAL_TIMEZONE") or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError("CLINICAL_TIMEZONE", "an IANA time zone such as Europe/Berlin") from None
    return name


def resources(tenants_file: Path | None = None) -> dict[str, object]:
    """One customer: secrets as EnvVar (read at launch, never shown), paths from
    pipelines/home.py. With a tenants file: each run's tenant's, looked up by its partition
    key in the step (the UI shows the file's path, never a credential)."""
    options = SyncOptionsResource(nightly_budget=os.environ.get(BUDGET_VARIABLE) or None)
    if tenants_file is not None:
        return {**tenant_resources(tenants_file), "sync_options": options}
    return {
        "clinical_api": ClinicalApiResource(
            base_url=EnvVar("CLINICAL_API_BASE_URL"),
            auth_url=EnvVar("CLINICAL_AUTH_URL"),
            client_id=EnvVar("CLINICAL_CLIENT_ID"),
            client_secret=EnvVar("CLINICAL_CLIENT_SECRET"),
            api_key=EnvVar("CLINICAL_API_KEY"),
            customer=EnvVar("CLINICAL_CUSTOMER"),
        ),
        "lake": LakeResource(root=home.lake_root()),
        "warehouse": WarehouseResource(path=home.warehouse_path()),
        "sync_options": options,
    }


def _options(**values: object) -> dict[str, object]:
    return {"resources": {"sync_options": {"config": values}}}


def jobs() -> list[AssetJob]:
    """The four jobs; with tenants each inherits the assets' partitions (a run is a tenant's)."""
    cursor_sets = [e for e in ENTITY_SETS if e.cursor is not None]
    return [
        define_asset_job(
            NIGHTLY_JOB,
            selection=AssetSelection.all(),
            description="Incremental sync of every entity set, then the analytics models",
        ),
        define_asset_job(
            FULL_JOB,
            selection=AssetSelection.all(),
            config=_options(full=True),
            description="Full snapshot of every selected set (select one set's assets to reset it)",
        ),
        define_asset_job(
            DOCUMENTS_JOB,
            selection=AssetSelection.assets(
                lake_key(DOCUMENTS), table_key(DOCUMENTS), CONTENT_KEY, PUBLISHED_KEY
            ),
            description=(
                "Patient documents' metadata, read in the patients' pages (content only when "
                "asked in the launchpad)"
            ),
        ),
        define_asset_job(
            BACKFILL_JOB,
            selection=AssetSelection.assets(
                *[lake_key(e) for e in cursor_sets], *[table_key(e) for e in cursor_sets]
            ).downstream(),  # the analytics tables that read them, and the publication
            config=_options(backfill_from="YYYY-MM-DD", backfill_to="YYYY-MM-DD"),
            description="Re-read a date range of the sets with a cursor (the nightly watermark "
            "stays), then the analytics models that read them",
        ),
    ]


def nightly_schedule(
    job: AssetJob, tenants_file: Path | None, share: Sequence[str] | None = None
) -> ScheduleDefinition:
    """At CLINICAL_NIGHTLY_CRON (default 02:00) in CLINICAL_TIMEZONE (default UTC): one run, or
    with tenants one run per tenant."""
    cron = (os.environ.get(CRON_VARIABLE) or "").strip() or NIGHTLY_CRON
    settings = {
        "name": NIGHTLY_SCHEDULE,
        "cron": cron,
        "timezone": timezone(),
        "description": "The nightly sync (CLINICAL_NIGHTLY_CRON, default 02:00, in "
        "CLINICAL_TIMEZONE, default UTC)",
    }
    try:
        if tenants_file is not None:
            settings["description"] += ", one run per tenant"
            return nightly_per_tenant(job, tenants_file, share=share, **settings)
        return ScheduleDefinition(
            name=settings["name"],
            job=job,
            cron_schedule=cron,
            execution_timezone=settings["timezone"],
            default_status=DefaultScheduleStatus.STOPPED,
            description=settings["description"],
        )
    except DagsterInvalidDefinitionError:  # Dagster's own check of the cron expression
        raise ConfigError(
            CRON_VARIABLE, "a cron expression of five fields, such as 0 2 * * *"
        ) from None


# Within one run, one step of each pool at a time (one extraction on the run's API key, one
# DuckDB writer on its warehouse); across runs the instance's pool limits hold (dagster.yaml).
# Dagster's default executor, its launchpad options kept (`in_process` too), with that limit
# added to `multiprocess` unless the run sets its own.
ONE_STEP_PER_POOL = [{"key": POOL_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]


def _one_step_per_pool(config: dict) -> dict:
    if "multiprocess" not in config:
        return config
    return {"multiprocess": {"tag_concurrency_limits": ONE_STEP_PER_POOL, **config["multiprocess"]}}


executor = multi_or_in_process_executor.configured(
    _one_step_per_pool,
    config_schema=multi_or_in_process_executor.config_schema,
    name=multi_or_in_process_executor.name,
)


def build_definitions(
    tenants_file: Path | None = None, worker_tenants: Sequence[str] | None = None
) -> Definitions:
    """The one factory: one customer from the environment and unpartitioned assets, or with a
    tenants file every asset partitioned by tenant, its partitions kept in step by a sensor;
    `worker_tenants`, the share of them whose nightly runs this code location starts."""
    partitions = TENANTS if tenants_file is not None else None
    assets = with_freshness(
        with_column_schemas(build_assets(partitions), [*ENTITY_SETS, DOCUMENTS]),
        [table_key(e) for e in ENTITY_SETS],
    )
    published = build_publish_asset(assets, partitions)
    all_jobs = jobs()
    sensors = [mark_failed_runs, alert_failed_runs, alert_inexact_runs]
    if tenants_file is not None:
        found = tenants.load(tenants_file)  # a broken file fails the location, every line shown
        for name in worker_tenants or ():
            found.get(name)  # CLINICAL_WORKER_TENANTS names tenants of the file
        sensors.append(tenant_partitions_sensor(tenants_file))
    return Definitions(
        assets=[*assets, published],
        asset_checks=build_reference_checks(),
        jobs=all_jobs,
        schedules=[nightly_schedule(all_jobs[0], tenants_file, worker_tenants)],
        sensors=sensors,
        resources=resources(tenants_file),
        executor=executor,
    )


webhook_from_env(os.environ)  # a malformed CLINICAL_ALERT_WEBHOOK stops the code location here
defs = build_definitions(home.tenants_file(), home.worker_tenants())
