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
# The op tag that repeats a step's pool, for the executor's limit within one run (definitions.py):
# the pool's own limit, in the instance's settings, holds across runs (dagster.yaml).
POOL_TAG = "clinical-sync/pool"
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


def in_pool(pool: str, *, first: bool = False) -> dict[str, object]:
    """A step's pool and the same name as an op tag (`POOL_TAG`): one step of the pool at a
    time within a run, whatever limit the instance gives the pool across runs. `first`: the
    step runs before any other ready step of the run (Dagster's `dagster/priority`)."""
    tags = {POOL_TAG: pool, **({"dagster/priority": "1"} if first else {})}
    return {"pool": pool, "op_tags": tags}
