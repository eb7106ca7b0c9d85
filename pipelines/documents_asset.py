"""`clinical/patient_document_content`: the documents' files, fetched only when asked.

The documents' metadata is a set like any other (`lake/patient_documents` rides in the
patients' pages, `clinical/patient_documents` loads it). Content is protected health
information and costs one request per file, so this step fetches it only when the launchpad
asks (`download_content: true`); otherwise it says how many files it would fetch.
"""

# No `from __future__ import annotations` here: Dagster reads the config class from the
# parameter's annotation at decoration time, which a string annotation would hide.

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    MaterializeResult,
    PartitionsDefinition,
    asset,
)
from pydantic import Field as ConfigField

from connectors.clinical_records.catalogue import DOCUMENTS
from connectors.clinical_records.client import ClinicalClient
from pipelines.keys import API_POOL, CLINICAL_GROUP, OWNERS, in_pool, table_key
from pipelines.partitions import tenant_of
from pipelines.resources import ApiAccess, LakeAccess, WarehouseAccess
from sync.document_content import (
    ContentResult,
    content_store,
    content_todo,
    download_content,
    record_content,
)
from sync.state import LOCK_WAIT_SECONDS
from warehouse.load import Warehouse

CONTENT_KEY = AssetKey(["clinical", "patient_document_content"])
CONTENT_OP = CONTENT_KEY.to_python_identifier()  # the step's name: Dagster's rule for a key


class ContentConfig(Config):
    """Launchpad: `ops: clinical__patient_document_content: config: download_content: true`."""

    download_content: bool = ConfigField(
        default=False, description="Fetch the files into the content store (PHI: opt-in)"
    )


def build_content_asset(partitions_def: PartitionsDefinition | None = None) -> AssetsDefinition:
    """The content step, partitioned by tenant or not (pipelines/assets.py, build_assets)."""

    @asset(
        key=CONTENT_KEY,
        deps=[table_key(DOCUMENTS)],
        group_name=CLINICAL_GROUP,
        kinds={"python", "duckdb"},
        owners=OWNERS,
        **in_pool(API_POOL),
        partitions_def=partitions_def,
        description="The documents' files in the content store, one request each; only when asked",
    )
    def patient_document_content(
        context: AssetExecutionContext,
        config: ContentConfig,
        clinical_api: ApiAccess,
        lake: LakeAccess,
        warehouse: WarehouseAccess,
    ) -> MaterializeResult:
        """The files the warehouse lists and the store lacks, for the run's tenant."""
        tenant = tenant_of(context)
        store = content_store(lake.root_of(tenant))
        with Warehouse(warehouse.working(tenant), wait=LOCK_WAIT_SECONDS) as wh:
            wh.ensure_schema()
            todo = content_todo(wh.con, store)
        result = ContentResult(wanted=len(todo))
        if config.download_content and todo:
            settings = clinical_api.settings(tenant)
            context.log.info(
                f"{DOCUMENTS.name}: {len(todo)} files to fetch, one request each: about "
                f"{len(todo) / settings.rate_limit:.0f} s at {settings.rate_limit:g} requests/s"
            )
            with ClinicalClient(settings, logger=context.log) as client:
                rows, result = download_content(client, store, todo, context.run.run_id)
            with Warehouse(warehouse.working(tenant), wait=LOCK_WAIT_SECONDS) as wh:
                record_content(wh.con, rows)
        elif todo:
            context.log.info(
                f"{DOCUMENTS.name}: {len(todo)} files not held; set download_content to fetch them"
            )
        return MaterializeResult(
            metadata={f"content_{k}": v for k, v in vars(result).items()}
            | {"download_content": config.download_content}
        )

    return patient_document_content
