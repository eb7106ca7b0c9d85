"""Asset keys and groups, one naming rule for the graph: `lake/<table>`, `clinical/<table>`,
`analytics/<view>`, and `published/warehouse`: the copy analysts read."""

from __future__ import annotations

from dagster import AssetKey

from connectors.clinical_records.catalogue import EntitySet

LAKE_GROUP = "lake"
CLINICAL_GROUP = "clinical"
ANALYTICS_GROUP = "analytics"
PUBLISHED_GROUP = "published"
OWNERS = ["team:clinical-data"]
API_POOL = "clinical_api"
WAREHOUSE_POOL = "warehouse"
# Job names: the UI's job pages list a run of `clinical-sync` under the job it stands for.
NIGHTLY_JOB = "nightly_sync"
FULL_JOB = "full_resync"
BACKFILL_JOB = "backfill_range"
DOCUMENTS_JOB = "documents_sync"


def lake_key(entity: EntitySet) -> AssetKey:
    return AssetKey([LAKE_GROUP, entity.table])


def table_key(entity: EntitySet) -> AssetKey:
    return AssetKey([CLINICAL_GROUP, entity.table])


def model_key(name: str) -> AssetKey:
    return AssetKey([ANALYTICS_GROUP, name])


PUBLISHED_KEY = AssetKey([PUBLISHED_GROUP, "warehouse"])
