"""Everything Dagster loads: `dagster dev -m pipelines.definitions`.

Jobs: `nightly_sync` (all assets, incremental, scheduled at 02:00 in CLINICAL_TIMEZONE),
`full_resync` (every set snapshotted: also the way to reset one set, by selecting its
assets), `documents_sync` (patient documents alone), `backfill_range` (re-read a date
range of the cursor sets without moving the watermark). Per-run options live in the `sync_options` resource's launchpad config.
"""

from __future__ import annotations

import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    Definitions,
    EnvVar,
    ScheduleDefinition,
    define_asset_job,
)

from connectors.clinical_records.catalogue import DOCUMENTS, ENTITY_SETS
from connectors.clinical_records.errors import ConfigError
from pipelines import home
from pipelines.assets import build_assets, build_publish_asset, build_reference_checks
from pipelines.checks import with_freshness
from pipelines.documents_asset import patient_document_content
from pipelines.keys import (
    BACKFILL_JOB,
    DOCUMENTS_JOB,
    FULL_JOB,
    NIGHTLY_JOB,
    PUBLISHED_KEY,
    lake_key,
    table_key,
)
from pipelines.resources import (
    ClinicalApiResource,
    LakeResource,
    SyncOptionsResource,
    WarehouseResource,
)
from pipelines.run_failures import mark_failed_runs
from pipelines.table_schemas import with_column_schemas
from sync.budget import BUDGET_VARIABLE
from warehouse.private import private_umask

NIGHTLY_CRON = "0 2 * * *"

# The code location's processes (code server, run and step workers) write the warehouse, the
# lake and Dagster's storage: every file they create is owner-only, whatever the umask.
private_umask()


def timezone() -> str:
    """CLINICAL_TIMEZONE (an IANA name) for the nightly schedule; UTC when unset."""
    name = os.environ.get("CLINICAL_TIMEZONE") or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError("CLINICAL_TIMEZONE", "an IANA time zone such as Europe/Berlin") from None
    return name


def resources() -> dict[str, object]:
    """Secrets as EnvVar (read at launch, never shown); paths from pipelines/home.py."""
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
        "sync_options": SyncOptionsResource(nightly_budget=os.environ.get(BUDGET_VARIABLE) or None),
    }


def _options(**values: object) -> dict[str, object]:
    return {"resources": {"sync_options": {"config": values}}}


ASSETS = with_freshness(
    with_column_schemas([*build_assets(), patient_document_content], [*ENTITY_SETS, DOCUMENTS]),
    [table_key(e) for e in ENTITY_SETS],
)
PUBLISHED = build_publish_asset(ASSETS)
CURSOR_SETS = [e for e in ENTITY_SETS if e.cursor is not None]

nightly_sync = define_asset_job(
    NIGHTLY_JOB,
    selection=AssetSelection.all(),
    description="Incremental sync of every entity set, then the analytics models",
)
full_resync = define_asset_job(
    FULL_JOB,
    selection=AssetSelection.all(),
    config=_options(full=True),
    description="Full snapshot of every selected set (select one set's assets to reset it)",
)
documents_sync = define_asset_job(
    DOCUMENTS_JOB,
    selection=AssetSelection.assets(
        lake_key(DOCUMENTS), table_key(DOCUMENTS), patient_document_content, PUBLISHED_KEY
    ),
    description=(
        "Patient documents' metadata, read in the patients' pages (content only when asked "
        "in the launchpad)"
    ),
)
backfill_range = define_asset_job(
    BACKFILL_JOB,
    selection=AssetSelection.assets(
        *[lake_key(e) for e in CURSOR_SETS], *[table_key(e) for e in CURSOR_SETS]
    ).downstream(),  # the analytics tables that read them, and the publication
    config=_options(backfill_from="YYYY-MM-DD", backfill_to="YYYY-MM-DD"),
    description="Re-read a date range of the sets with a cursor (the nightly watermark stays), "
    "then the analytics models that read them",
)
nightly_schedule = ScheduleDefinition(
    name="nightly_sync_schedule",
    job=nightly_sync,
    cron_schedule=NIGHTLY_CRON,
    execution_timezone=timezone(),
    default_status=DefaultScheduleStatus.STOPPED,
    description="The nightly sync at 02:00 (CLINICAL_TIMEZONE, default UTC)",
)

defs = Definitions(
    assets=[*ASSETS, PUBLISHED],
    asset_checks=build_reference_checks(),
    jobs=[nightly_sync, full_resync, documents_sync, backfill_range],
    schedules=[nightly_schedule],
    sensors=[mark_failed_runs],
    resources=resources(),
)
