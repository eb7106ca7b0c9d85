"""The analysts' models as Dagster assets (dagster-dbt): every model of the dbt project
(`transform/`, or the analytics team's at CLINICAL_DBT_PROJECT) an asset downstream of the
clinical tables it reads, its tests asset checks, one step building the models a run's loads
made stale (`warehouse/models.py`: dbt in this process, nothing parsed at run time).

The step runs after the loads and before the publication, which does not depend on it: a
model that fails (bad SQL, a test of severity error) fails this step, names the model, and
keeps its last table, marked stale (analytics.model_health); the night's clinical tables
publish all the same. The order comes from the steps' priorities (`keys.MODELS_BEFORE_PUBLISH`),
tested in tests/test_pipelines_models.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dagster import AssetDep, AssetKey, AssetSpec, MetadataValue, PartitionsDefinition
from dagster_dbt import DagsterDbtTranslator, dbt_assets
from dagster_dbt.core.dbt_cli_event import DbtCoreCliEventMessage

from connectors.clinical_records.catalogue import BY_TABLE
from pipelines import home
from pipelines.keys import (
    ANALYTICS_GROUP,
    EXACTNESS_KEY,
    MODELS_PRIORITY,
    OWNERS,
    WAREHOUSE_POOL,
    in_pool,
    model_key,
    table_key,
)
from pipelines.partitions import tenant_of
from pipelines.resources import WarehouseAccess
from sync.phase import Phase, enter
from sync.state import LOCK_WAIT_SECONDS
from warehouse import models
from warehouse.dbt_project import Project, catalog, manifest_json, prepare, project_dir
from warehouse.ddl import ANALYTICS, CLINICAL
from warehouse.errors import ModelsFailed

# dbt's events that say how a node ended: what Dagster's materializations and checks come from.
RESULT_EVENTS = frozenset({"LogModelResult", "LogTestResult", "LogSeedResult", "LogSnapshotResult"})
STEP = "analytics_models"
BUILD_SECONDS, BUILD_CPU_SECONDS = "build_seconds", "build_cpu_seconds"


class Translator(DagsterDbtTranslator):
    """A clinical table dbt reads is its load's asset (`clinical/<table>`), whatever the
    project calls its source; a model is `analytics/<table>` in the analytics group."""

    def get_asset_key(self, dbt_resource_props: Mapping[str, Any]) -> AssetKey:
        props = dbt_resource_props
        if props["resource_type"] == "source":
            table = props.get("identifier") or props["name"]
            if props.get("schema") == CLINICAL and table in BY_TABLE:
                return table_key(BY_TABLE[table])
        if props["resource_type"] in ("model", "seed", "snapshot"):
            return model_key(props.get("alias") or props["name"])
        return super().get_asset_key(dbt_resource_props)

    def get_asset_spec(
        self, manifest: Mapping[str, Any], unique_id: str, project: Any
    ) -> AssetSpec:
        """A model also waits for the run's end (`clinical/exactness`), which may load more."""
        spec = super().get_asset_spec(manifest, unique_id, project)
        if spec.key.path[0] != ANALYTICS_GROUP or EXACTNESS_KEY in {d.asset_key for d in spec.deps}:
            return spec
        return spec.replace_attributes(deps=[*spec.deps, AssetDep(EXACTNESS_KEY)])

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return ANALYTICS_GROUP

    def get_owners(self, dbt_resource_props: Mapping[str, Any]) -> list[str]:
        return list(OWNERS)


def configured_project() -> Project:
    """The dbt project of CLINICAL_DBT_PROJECT (else transform/), parsed for the catalog name
    of WAREHOUSE_PATH (a tenant's warehouse of another name gets its own parse, once)."""
    return prepare(project_dir(os.environ), database=catalog(Path(home.warehouse_path())))


def models_project(env: Mapping[str, str], warehouse_path: str | Path) -> Project:
    """The dbt project of CLINICAL_DBT_PROJECT in `env` (else transform/), parsed once per
    content for the warehouse's catalog name, its manifest loaded in this process."""
    project = prepare(project_dir(env), database=catalog(Path(warehouse_path)))
    project.manifest()
    return project


def build_dbt_assets(project: Project, partitions_def: PartitionsDefinition | None = None):
    """The project's models as one multi-asset, built by one step in the `warehouse` pool."""
    manifest = manifest_json(project)
    translator = Translator()
    pool = in_pool(WAREHOUSE_POOL, priority=MODELS_PRIORITY)

    @dbt_assets(
        manifest=manifest,
        dagster_dbt_translator=translator,
        partitions_def=partitions_def,
        name=STEP,
        pool=pool["pool"],
        op_tags=pool["op_tags"],
    )
    def analytics_models(context, warehouse: WarehouseAccess) -> Iterator[Any]:
        """The models a table they read changed in made again, their tests run."""
        enter(Phase.LOAD, ANALYTICS)
        chosen = {key.path[-1] for key in context.selected_asset_keys}
        results: list[dict[str, Any]] = []

        def on_event(event: Any) -> None:
            if event.info.name in RESULT_EVENTS:
                from dbt_common.events.functions import msg_to_dict

                results.append(msg_to_dict(event))

        built = models.build(
            warehouse.working(tenant_of(context)),
            project,
            only=chosen,
            run_id=context.run.run_id,
            on_event=on_event,
            wait=LOCK_WAIT_SECONDS,
        )
        for raw in results:
            for event in DbtCoreCliEventMessage(raw, {}).to_default_asset_events(
                manifest, translator, context
            ):
                yield _with_figures(event, built)
        context.log.info(
            f"dbt ({project.path.name}): {built.summary()} in {built.seconds} s, "
            f"{built.cpu_seconds} s of CPU"
        )
        if built.failed:
            raise ModelsFailed(built.failed)

    return analytics_models


def _with_figures(event: Any, built: models.Built) -> Any:
    """A model's materialization with the rows its table holds, and what the step's build
    cost (every model alike: one dbt command builds them all)."""
    name = getattr(event, "output_name", "")
    prefix = model_key("").to_python_identifier()  # "analytics__"
    model = name[len(prefix) :] if name.startswith(prefix) else None
    if model not in built.built:
        return event
    figures = {
        "rows": MetadataValue.int(built.built[model]),
        BUILD_SECONDS: MetadataValue.float(built.seconds),
        BUILD_CPU_SECONDS: MetadataValue.float(built.cpu_seconds),
    }
    return event.with_metadata({**event.metadata, **figures})
