"""The `clinical/patient_documents` asset: the documents sync of `pipelines.documents` in Dagster.

API-bound (one request per listed patient), so it runs in the `clinical_api` pool and takes
the warehouse's write lock only for its short loads. Its metadata says what the budget plan
expected and what the run spent.
"""

# No `from __future__ import annotations` here: Dagster reads the config class from the
# parameter's annotation at decoration time, which a string annotation would hide.

from datetime import timedelta

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field as ConfigField

from connectors.clinical_records.catalogue import DOCUMENTS, PATIENTS
from pipelines.documents import sync_documents
from pipelines.documents_plan import DocumentsOptions
from pipelines.keys import API_POOL, CLINICAL_GROUP, OWNERS, table_key
from pipelines.liveness import run_started_at
from pipelines.resources import (
    ClinicalApiResource,
    LakeResource,
    SyncOptionsResource,
    WarehouseResource,
)


class DocumentsConfig(Config):
    """Per-run options of the documents sync (launchpad: `ops: clinical__patient_documents`)."""

    full_listing: bool = ConfigField(
        default=False, description="List every patient now (marks deleted documents)"
    )
    full_listing_every_days: float = ConfigField(
        default=7.0, description="Cadence of the full listing; other runs list changed patients"
    )
    download_content: bool = ConfigField(
        default=False, description="Also fetch the files into the content store (PHI: opt-in)"
    )

    def options(self, full: bool) -> DocumentsOptions:
        return DocumentsOptions(
            full=self.full_listing or full,
            full_every=timedelta(days=self.full_listing_every_days),
            download_content=self.download_content,
        )


@asset(
    key=table_key(DOCUMENTS),
    deps=[table_key(PATIENTS)],
    group_name=CLINICAL_GROUP,
    kinds={"python", "duckdb", "table"},
    owners=OWNERS,
    pool=API_POOL,
    tags={"strategy": DOCUMENTS.strategy.value},
    description=(
        "Patient documents' metadata, listed per patient: changed patients nightly, all on "
        "the full-listing cadence (deletes marked); file content only when asked"
    ),
)
def patient_documents(
    context: AssetExecutionContext,
    config: DocumentsConfig,
    clinical_api: ClinicalApiResource,
    lake: LakeResource,
    warehouse: WarehouseResource,
    sync_options: SyncOptionsResource,
) -> MaterializeResult:
    report = sync_documents(
        clinical_api.settings(),
        lake_root=lake.root,
        warehouse_path=warehouse.working(),
        run_id=context.run.run_id,
        options=config.options(sync_options.full),
        logger=context.log,
        started_at=run_started_at(context.instance, context.run.run_id),
    )
    return MaterializeResult(
        metadata={
            **report.metadata(),
            "table": MetadataValue.text(f"clinical.{DOCUMENTS.table}"),
        }
    )
