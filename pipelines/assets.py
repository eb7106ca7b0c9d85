"""The asset factory: per entity set of the catalogue, an extraction into the lake and a load
into DuckDB; downstream, the analytics models. No asset body is written per entity set.

Two assets per set rather than one: extraction is API-bound and may run in parallel (pool
`clinical_api`), loading is DuckDB-bound and runs one at a time (pool `warehouse`), and the
graph then shows where the time and the requests go.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetChecksDefinition,
    AssetIn,
    AssetKey,
    AssetOut,
    AssetsDefinition,
    AssetSpec,
    MaterializeResult,
    MetadataValue,
    Output,
    PartitionsDefinition,
    asset,
    multi_asset,
)

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    FAMILIES,
    RIDES_WITH,
    EntitySet,
    Strategy,
)
from connectors.clinical_records.client import ClinicalClient
from pipelines import checks, run_record
from pipelines.documents_asset import build_content_asset
from pipelines.exactness_asset import build_exactness_asset
from pipelines.keys import (
    ANALYTICS_GROUP,
    API_POOL,
    CLINICAL_GROUP,
    EXACTNESS_KEY,
    LAKE_GROUP,
    LOADS_FIRST,
    OWNERS,
    PUBLISHED_GROUP,
    PUBLISHED_KEY,
    WAREHOUSE_POOL,
    in_pool,
    lake_key,
    model_key,
    table_key,
)
from pipelines.liveness import run_started_at
from pipelines.partitions import tenant_of
from pipelines.resources import (
    ApiAccess,
    LakeAccess,
    SyncOptionsResource,
    WarehouseAccess,
)
from sync.budget import parse_budget, set_staleness, staleness_figure
from sync.extract import Extraction, LakeBatches
from sync.inputs import budget_applies, set_inputs, within_budget
from sync.packed import extract_family
from sync.phase import Phase, enter
from sync.progress import current
from sync.reconcile import Reconciliation
from sync.service_memory import ServiceMemory
from sync.settle import journal
from sync.state import (
    LOCK_WAIT_SECONDS,
    CommittedState,
    covered_since,
)
from sync.strategy import Mode
from warehouse import ledger
from warehouse.ddl import ANALYTICS
from warehouse.figures import Figure, keyed_by_text
from warehouse.load import LoadResult, SetResult, Warehouse
from warehouse.models import Model, models
from warehouse.publish import publish
from warehouse.writer import writing

# The client's counters (`Counters`, as `Extraction.stats` holds them) as the UI plots them.
API_FIGURES: dict[str, Figure] = {
    "requests": Figure.REQUESTS,
    "pages": Figure.PAGES,
    "throttled": Figure.THROTTLED_429,
    "retries": Figure.RETRIES,
    "wait_seconds": Figure.WAIT_SECONDS,
    "token_refreshes": Figure.TOKEN_REFRESHES,
}
# A load's `LoadResult` fields as the UI plots them.
LOAD_FIGURES: dict[Figure, str] = {
    Figure.ROWS_FETCHED: "fetched",
    Figure.ROWS_INSERTED: "inserted",
    Figure.ROWS_UPDATED: "updated",
    Figure.ROWS_UNCHANGED: "unchanged",
    Figure.ROWS_SOFT_DELETED: "soft_deleted",
    Figure.ROWS_RESURRECTED: "resurrected",
    Figure.ROWS_REJECTED: "rejected",
}


# What each strategy fetches, as the asset descriptions tell it in the UI.
STRATEGY_TEXT: dict[Strategy, str] = {
    Strategy.CURSOR: "rows changed since the watermark (less a lookback)",
    Strategy.CREATED: "new rows by creation time; a full snapshot on a cadence",
    Strategy.SNAPSHOT: "a full snapshot every run",
    Strategy.PERIODIC_SNAPSHOT: "a full snapshot on a cadence (no cursor)",
    Strategy.PER_PATIENT: "every document of every patient read, deletes marked",
}


def run_figures(reconciliation: Reconciliation) -> dict[Figure, int]:
    """A set's reconciliation as `ops.sync_runs` sums it (`RECONCILE_FIGURES`)."""
    return {
        Figure.RECONCILED: reconciliation.reconciled,
        Figure.RECONCILE_REQUESTS: reconciliation.requests,
        Figure.UNRECONCILED: reconciliation.unreconciled,
    }


def api_metadata(extraction: Extraction) -> dict[Figure, Any]:
    return {figure: extraction.stats.get(name, 0) for name, figure in API_FIGURES.items()}


def extraction_metadata(extraction: Extraction) -> dict[str, Any]:
    return keyed_by_text(
        {
            "mode": extraction.mode.value,
            "reason": extraction.reason,
            Figure.ROWS_FETCHED: extraction.fetched,
            Figure.ROWS_REJECTED: extraction.rejected,
            Figure.SOURCE_COUNT: extraction.source_total
            if extraction.source_total is not None
            else -1,
            "lake_files_written": len(extraction.files),
            "watermark": extraction.watermark or "",
            "seconds": extraction.seconds,
            **api_metadata(extraction),
            **extraction.reconciliation.metadata(),
        }
    )


def _log_reconciliation(log: Any, extraction: Extraction) -> None:
    r = extraction.reconciliation
    if extraction.mode is Mode.SKIP:
        return
    line = (
        f"{extraction.entity}: reconciled with the source in {r.requests} extra requests: "
        f"{r.caught_up} written during the run re-read, {r.inserted} found in key ranges, "
        f"{r.deleted} found deleted ({r.ranges} ranges, {r.rounds} probes)"
    )
    if r.residual:
        log.warning(f"{line}; the count still differs by {r.residual}")
    elif r.unconfirmed:
        log.warning(f"{line}; {r.unconfirmed} records counted before the read were not found")
    else:
        log.info(line + (f"; {r.blind}" if r.blind else ""))


def build_extract_asset(
    family: Sequence[EntitySet],
    partitions_def: PartitionsDefinition | None = None,
    priority: int = 0,
) -> AssetsDefinition:
    """One extraction per family: a set and the sets that ride in its pages (one request
    carries a hundred parents and their children), a lake asset for each. `priority`: its
    place among the run's extractions (`read_order`)."""
    root = family[0]
    outs = {
        e.table: AssetOut(
            key=lake_key(e),
            group_name=LAKE_GROUP,
            kinds={"python", "parquet"},
            owners=OWNERS,
            tags={"strategy": e.strategy.value},
            is_required=False,
            description=f"{e.name} from the API into Parquet batches: {_how(e)}",
        )
        for e in family
    }

    @multi_asset(
        outs=outs,
        name=f"extract_{root.table}",
        **in_pool(API_POOL, priority=priority),
        can_subset=True,
        partitions_def=partitions_def,
    )
    def extract_family_assets(
        context,  # AssetExecutionContext (Dagster needs it unannotated under PEP 563)
        clinical_api: ApiAccess,
        lake: LakeAccess,
        warehouse: WarehouseAccess,
        sync_options: SyncOptionsResource,
    ) -> Iterator[Output[Extraction]]:
        tenant = tenant_of(context)
        settings = clinical_api.settings(tenant)
        chosen = [e for e in family if lake_key(e) in context.selected_asset_keys]
        options = sync_options.options()
        budget = parse_budget(sync_options.nightly_budget, settings.rate_limit)
        with CommittedState(warehouse.working(tenant)) as committed:  # one read-only look per step
            if budget_applies(options, budget):
                started = run_started_at(context.instance, context.run.run_id) or datetime.now(UTC)
                options, told = within_budget(options, budget, *committed.sizes(), started)
                context.log.info(told)
            inputs = set_inputs(chosen, committed, options)
        the_lake = lake.lake(tenant)
        the_lake.record_source(
            settings.base_url, settings.customer, force=sync_options.force_source
        )
        memory = ServiceMemory(the_lake.root, retry_after=options.snapshot_every)
        results: dict[str, Extraction] = {}
        with ClinicalClient(settings, logger=context.log) as client:
            try:
                results = extract_family(
                    family,
                    inputs,
                    client,
                    LakeBatches(the_lake),
                    run_id=context.run.run_id,
                    progress=current(context.log.info),
                    memory=memory,
                    say=context.log,
                )
            finally:  # every request it sent, for the run's end (pipelines/exactness_asset.py)
                settled = results.values() if "results" in locals() else ()
                the_lake.write_journal(
                    context.run.run_id,
                    f"extract_{root.table}",
                    journal(client.stats.looks, settled),
                )
        for e in chosen:
            _log_reconciliation(context.log, results[e.name])
            yield Output(
                results[e.name], output_name=e.table, metadata=extraction_metadata(results[e.name])
            )

    return extract_family_assets


def _how(entity: EntitySet) -> str:
    if entity.name in RIDES_WITH:
        return (
            f"in the pages of {RIDES_WITH[entity.name][0].name} ($expand); "
            + STRATEGY_TEXT[entity.strategy]
        )
    return STRATEGY_TEXT[entity.strategy]


def build_load_asset(
    entity: EntitySet, partitions_def: PartitionsDefinition | None = None
) -> AssetsDefinition:
    @asset(
        partitions_def=partitions_def,
        key=table_key(entity),
        ins={"extraction": AssetIn(key=lake_key(entity))},
        group_name=CLINICAL_GROUP,
        kinds={"duckdb", "table"},
        owners=OWNERS,
        # A set lands as soon as its family is read, before the next family's extraction:
        # the load's CPU falls between that family's requests, which the rate limit spaces
        # anyway (the bucket's burst catches up the pause), instead of every load waiting for
        # the last request. The nightly budget already weighs sets this run has loaded.
        **in_pool(WAREHOUSE_POOL, priority=LOADS_FIRST),
        tags={"strategy": entity.strategy.value},
        check_specs=checks.table_check_specs(entity),
        description=f"Current {entity.name}: merged by {entity.key}, deletes marked, history kept",
    )
    def load_entity(
        context,  # AssetExecutionContext
        extraction: Extraction,
        clinical_api: ApiAccess,
        warehouse: WarehouseAccess,
        sync_options: SyncOptionsResource,
    ) -> Iterator[Any]:
        tenant = tenant_of(context)
        settings = clinical_api.settings(tenant)
        with Warehouse(warehouse.working(tenant), wait=LOCK_WAIT_SECONDS) as wh:
            wh.ensure_schema()
            wh.check_source(settings.base_url, settings.customer, force=sync_options.force_source)
            result = LoadResult()
            enter(Phase.LOAD, entity.name)
            if extraction.mode is not Mode.SKIP:
                result = wh.load(
                    entity,
                    extraction.files,
                    run_id=extraction.run_id,
                    snapshot=extraction.snapshot,
                    watermark=extraction.watermark,
                )
            hours = set_staleness(entity, covered_since(wh.con, entity), datetime.now(UTC))
            staleness = staleness_figure(hours or 0.0)
            count = checks.SourceCount.of(
                wh.con,
                entity,
                run_id=extraction.run_id,
                source=extraction.source_total,
                stale=extraction.reconciliation.stale,
            )
            results = checks.table_check_results(
                count, ledger.run_unfit(wh.con, entity.name, extraction.run_id)
            )
            results.append(
                checks.reconciled_result(extraction.reconciliation, extraction.mode is Mode.SKIP)
            )
            if hours is not None:
                results.append(checks.staleness_result(hours, sync_options.staleness_warn_hours))
            ended = SetResult(
                entity.name,
                extraction.mode.value,
                count.live,
                extraction.reconciliation.unreconciled,
                staleness_hours=None if hours is None else staleness,
            )
            with wh.transaction():  # the set's figures and its checks, together
                wh.record_set_result(
                    context.run.run_id,
                    ended,
                    {**vars(result), **run_figures(extraction.reconciliation)},
                )
                checks.record(wh.con, context.run.run_id, entity.name, results)
            watermark = wh.watermark(entity)
        yield MaterializeResult(
            metadata=keyed_by_text(
                {
                    "mode": extraction.mode.value,
                    **{figure: getattr(result, name) for figure, name in LOAD_FIGURES.items()},
                    **api_metadata(extraction),
                    **run_figures(extraction.reconciliation),  # `unreconciled` among them
                    **extraction.reconciliation.metadata(),  # what it could not see, too
                    Figure.SOURCE_STALENESS_HOURS: staleness,
                    "watermark": watermark or "",
                    "lake_files_written": len(extraction.files),
                    **count.figures(),
                    "table": MetadataValue.text(f"clinical.{entity.table}"),
                }
            )
        )
        # Named in full: Dagster otherwise looks up the asset's materialization once more per
        # check only to learn which check a result is (a storage query each).
        yield from (result._replace(asset_key=table_key(entity)) for result in results)

    return load_entity


def build_models_asset(
    found: list[Model], partitions_def: PartitionsDefinition | None = None
) -> AssetsDefinition:
    """The analytics tables, downstream of the clinical tables each reads: one step builds
    them all in one transaction after the run's loads (a failure keeps the previous ones,
    and the publication waits for the next run that builds them)."""
    specs = [
        AssetSpec(
            model_key(m.name),
            deps=[*(table_key(e) for e in m.sources), EXACTNESS_KEY],
            group_name=ANALYTICS_GROUP,
            kinds={"duckdb", "sql", "table"},
            owners=OWNERS,
            description=m.description,
        )
        for m in found
    ]

    @multi_asset(
        specs=specs,
        name="analytics_models",
        **in_pool(WAREHOUSE_POOL),
        can_subset=True,
        partitions_def=partitions_def,
    )
    def analytics_models(context, warehouse: WarehouseAccess) -> Iterator[MaterializeResult]:
        enter(Phase.LOAD, ANALYTICS)
        with Warehouse(warehouse.working(tenant_of(context)), wait=LOCK_WAIT_SECONDS) as wh:
            wh.ensure_schema()
            started = time.monotonic()
            rows = wh.refresh_models()
            seconds = round(time.monotonic() - started, 3)
        context.log.info(f"analytics tables built in {seconds} s: {rows}")
        for m in found:
            key = model_key(m.name)
            if key in context.selected_asset_keys:
                yield MaterializeResult(
                    asset_key=key, metadata={"rows": rows[m.name], "build_seconds": seconds}
                )

    return analytics_models


def build_publish_asset(
    upstream: Sequence[AssetKey | AssetsDefinition],
    partitions_def: PartitionsDefinition | None = None,
) -> AssetsDefinition:
    """`published/warehouse`, downstream of every step that writes the warehouse: it runs
    when they all succeeded (a failed or skipped one skips it), so a failed run publishes
    nothing. Alone in the `warehouse` pool, like every step that writes DuckDB. The run's
    last write: it records the run's ending, `success`, in the copy it publishes."""
    keys = [k for u in upstream for k in _keys(u)]

    @asset(
        key=PUBLISHED_KEY,
        deps=list(dict.fromkeys(keys)),
        group_name=PUBLISHED_GROUP,
        kinds={"duckdb"},
        owners=OWNERS,
        **in_pool(WAREHOUSE_POOL),
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
        with (
            writing(work, wait=LOCK_WAIT_SECONDS),  # the run's row and its publication
            run_record.finishing(context, place, full=sync_options.full),
        ):
            done = publish(work, warehouse.published(tenant), wait=LOCK_WAIT_SECONDS)
        context.log.info(f"published {done.path} ({done.bytes:,} bytes) in {done.seconds} s")
        return MaterializeResult(
            metadata={
                "path": MetadataValue.path(str(done.path)),
                "bytes": done.bytes,
                "seconds": done.seconds,
            }
        )

    return published_warehouse


def _keys(upstream: AssetKey | AssetsDefinition) -> list[AssetKey]:
    return [upstream] if isinstance(upstream, AssetKey) else list(upstream.keys)


def read_order(rotation: int = 0) -> dict[str, int]:
    """Each family's extraction priority, by its root table: none (Dagster's order, the step
    keys'), or that order started `rotation` families later, the ones skipped read last.

    Tenants started together move in step: each waits on its own rate limit through its
    largest family while the cores idle, then all load at once. `sync --all-tenants` starts
    each tenant at another family (its place in the file), so some read while others load:
    ten tenants at scale 1 on two cores took 33.5-33.7 s rotated against 35.2-36.2 s with
    every other tenant one family on (benchmarks/tenants_parallel.py's setting)."""
    roots = sorted(family[0].table for family in FAMILIES)
    shift = rotation % len(roots)
    if not shift:
        return dict.fromkeys(roots, 0)
    rotated = roots[shift:] + roots[:shift]
    return {root: -1 - place for place, root in enumerate(rotated)}  # below the loads'


def build_assets(
    partitions_def: PartitionsDefinition | None = None, *, read_rotation: int = 0
) -> list[AssetsDefinition]:
    """Per family an extraction, per set a load, the models and the documents' files; every
    one partitioned by `partitions_def` (tenants) or none."""
    order = read_order(read_rotation)
    out = [build_extract_asset(f, partitions_def, order[f[0].table]) for f in FAMILIES]
    out += [build_load_asset(entity, partitions_def) for entity in ALL_ENTITIES]
    out.append(build_exactness_asset(partitions_def))
    out.append(build_models_asset(models(), partitions_def))
    out.append(build_content_asset(partitions_def))
    return out


def build_sync_assets(
    partitions_def: PartitionsDefinition | None = None, *, read_rotation: int = 0
) -> list[AssetsDefinition]:
    """The entity sets' assets, the models and the documents' files, then their publication."""
    found = build_assets(partitions_def, read_rotation=read_rotation)
    return [*found, build_publish_asset(found, partitions_def)]


def build_reference_checks() -> list[AssetChecksDefinition]:
    return [checks.reference_checks()]
