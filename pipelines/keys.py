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
PRIORITY_TAG = "dagster/priority"
LOADS_FIRST = 1  # a set's load runs before the next family's extraction (assets.py)
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
# The run's end: every set's last look checked, those touched after it looked at again.
EXACTNESS_KEY = AssetKey([CLINICAL_GROUP, "exactness"])


def in_pool(pool: str, *, priority: int = 0) -> dict[str, object]:
    """A step's pool and the same name as an op tag (`POOL_TAG`): one step of the pool at a
    time within a run, whatever limit the instance gives the pool across runs. `priority`:
    among the run's ready steps, the higher runs first (Dagster's `dagster/priority`, 0 when
    absent; ties in step key order)."""
    tags = {POOL_TAG: pool, **({PRIORITY_TAG: str(priority)} if priority else {})}
    return {"pool": pool, "op_tags": tags}
