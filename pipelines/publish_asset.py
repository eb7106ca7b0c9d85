"""`published/warehouse`: the working copy published at WAREHOUSE_PATH once the run's steps that
write the clinical tables have succeeded (warehouse/publish.py does the copy)."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import (
    AssetKey,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
)

from pipelines import run_record
from pipelines.keys import (
    ANALYTICS_GROUP,
    OWNERS,
    PUBLISH_PRIORITY,
    PUBLISHED_GROUP,
    PUBLISHED_KEY,
    WAREHOUSE_POOL,
    in_pool,
)
from pipelines.partitions import tenant_of
from pipelines.resources import LakeAccess, SyncOptionsResource, WarehouseAccess
from sync.phase import Phase, enter
from sync.state import LOCK_WAIT_SECONDS
from warehouse import models
from warehouse.load import Warehouse
from warehouse.publish import publish
from warehouse.writer import writing


def build_publish_asset(
    upstream: Sequence[AssetKey | AssetsDefinition],
    partitions_def: PartitionsDefinition | None = None,
) -> AssetsDefinition:
    """`published/warehouse`, downstream of every step that writes the clinical tables: it
    runs when they all succeeded (a failed or skipped one skips it), so a failed run publishes
    nothing. Not downstream of the models (a model that fails must not hold the night's
    tables back): the models step runs first by priority (pipelines/dbt_assets.py), and a
    model older than the tables it reads is published saying so. Alone in the `warehouse`
    pool, like every step that writes DuckDB. The run's last write: it records the run's
    ending in the copy it publishes, `success`, or `failed` naming the models that failed."""
    keys = [k for u in upstream for k in _keys(u) if k.path[0] != ANALYTICS_GROUP]

    @asset(
        key=PUBLISHED_KEY,
        deps=list(dict.fromkeys(keys)),
        group_name=PUBLISHED_GROUP,
        kinds={"duckdb"},
        owners=OWNERS,
        **in_pool(WAREHOUSE_POOL, priority=PUBLISH_PRIORITY),
        partitions_def=partitions_def,
        description=(
            "The warehouse analysts read (WAREHOUSE_PATH): the working copy as this run "
            "committed it, published atomically; open connections keep the previous one"
        ),
    )
    def published_warehouse(
        context,
        warehouse: WarehouseAccess,
        lake: LakeAccess,
        sync_options: SyncOptionsResource,
    ) -> MaterializeResult:
        enter(Phase.PUBLISH)
        tenant = tenant_of(context)
        work = warehouse.working(tenant)
        place = run_record.Place(warehouse.published(tenant), lake.root_of(tenant))
        with writing(work, wait=LOCK_WAIT_SECONDS):  # the run's row and its publication
            with Warehouse(work, wait=LOCK_WAIT_SECONDS) as wh:
                failed = models.failed_in(wh.con, context.run.run_id)
            failure = (
                "models failed: " + "; ".join(f"{m} ({w})" for m, w in failed.items())
                if failed
                else None
            )
            with run_record.finishing(context, place, sync_options.full, failure):
                done = publish(work, warehouse.published(tenant), wait=LOCK_WAIT_SECONDS)
        context.log.info(f"published {done.path} ({done.bytes:,} bytes) in {done.seconds} s")
        if done.stale_models:
            context.log.warning(f"models older than their tables: {', '.join(done.stale_models)}")
        return MaterializeResult(
            metadata={
                "path": MetadataValue.path(str(done.path)),
                "bytes": done.bytes,
                "seconds": done.seconds,
                "stale_models": MetadataValue.text(", ".join(done.stale_models) or "none"),
            }
        )

    return published_warehouse


def _keys(upstream: AssetKey | AssetsDefinition) -> list[AssetKey]:
    return [upstream] if isinstance(upstream, AssetKey) else list(upstream.keys)
