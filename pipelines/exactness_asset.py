"""The end of every run, `clinical/exactness`: each set's last look checked against every
request of the run, the sets touched after theirs looked at again and loaded (sync/settle.py,
the rule in sync/exactness.py), before the models and the publication.

Every extraction step leaves its journal in the lake (each request's look, each set's last
look and change mark); this step reads them all, so a request of one family's step that
showed another family's set counts, whichever process sent it. Its one check, `sets_settled`,
is where the run decides that its sets are exact: it fails (ERROR) for a set still touched
after its last look, and names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetsDefinition,
    MaterializeResult,
    PartitionsDefinition,
    asset,
)

from connectors.clinical_records.catalogue import ALL_BY_NAME, ALL_ENTITIES
from connectors.clinical_records.client import ClinicalClient
from pipelines.checks import SETTLED, UNSETTLED
from pipelines.keys import CLINICAL_GROUP, EXACTNESS_KEY, OWNERS, WAREHOUSE_POOL, in_pool, table_key
from pipelines.partitions import tenant_of
from pipelines.resources import ApiAccess, LakeAccess, WarehouseAccess
from sync.extract import LakeBatches
from sync.phase import Phase, enter
from sync.settle import RunJournal, Settlement, settle
from sync.state import LOCK_WAIT_SECONDS, CommittedState
from warehouse import runs
from warehouse.load import Warehouse


def build_exactness_asset(partitions_def: PartitionsDefinition | None = None) -> AssetsDefinition:
    @asset(
        key=EXACTNESS_KEY,
        deps=[table_key(e) for e in ALL_ENTITIES],
        group_name=CLINICAL_GROUP,
        kinds={"python", "duckdb"},
        owners=OWNERS,
        **in_pool(WAREHOUSE_POOL),
        partitions_def=partitions_def,
        check_specs=[
            AssetCheckSpec(
                SETTLED,
                asset=EXACTNESS_KEY,
                description=(
                    "Every set read this run was settled by a look sent after every other "
                    "request of the run that touched it had been answered (as the set asked, "
                    "expanded or counted per parent); a set touched later was looked at again. "
                    "Fails for a set still touched after its last look, naming it"
                ),
            )
        ],
        description=(
            "The run's end: each set's last look against every request of the run; the sets "
            "touched after it looked at again and loaded, before the models and publication"
        ),
    )
    def exactness(
        context,  # AssetExecutionContext
        clinical_api: ApiAccess,
        lake: LakeAccess,
        warehouse: WarehouseAccess,
    ) -> Iterator[Any]:
        tenant, run_id = tenant_of(context), context.run.run_id
        the_lake, working = lake.lake(tenant), warehouse.working(tenant)
        run = RunJournal.of(the_lake.journals(run_id))
        enter(Phase.RECONCILE, "the run's end")
        with (
            CommittedState(working) as committed,
            ClinicalClient(clinical_api.settings(tenant), logger=context.log) as client,
        ):
            found = settle(
                run.last_looks,
                run.marks,
                run.looks,
                committed,
                client,
                LakeBatches(the_lake),
                run_id=run_id,
                say=context.log,
            )
            sent = client.stats.requests
        with Warehouse(working, wait=LOCK_WAIT_SECONDS) as wh:
            enter(Phase.LOAD, "the run's end")
            for name, again in found.again.items():
                for extraction in again:
                    wh.load(
                        ALL_BY_NAME[name],
                        extraction.files,
                        run_id=run_id,
                        watermark=extraction.watermark,
                    )
            with wh.transaction():
                for name in found.unsettled:
                    runs.mark_unsettled(wh.con, run_id, name, SETTLED)
        the_lake.drop_journals()
        yield MaterializeResult(metadata=_figures(run, found, sent))
        yield _check(run, found)

    return exactness


def _figures(run: RunJournal, found: Settlement, sent: int) -> dict[str, int]:
    """`requests`: what the run's end sent itself (the steps' own are theirs, so that the
    run's requests add up across its assets); `requests judged`: every request of the run."""
    looked = {f"looked again {name}": len(again) for name, again in found.again.items()}
    return {
        "requests": sent,
        "requests judged": len(run.looks),
        "sets settled": len(run.last_looks),
        **looked,
        **{f"touched after {name}": n for name, n in found.touched_after.items()},
    }


def _check(run: RunJournal, found: Settlement) -> AssetCheckResult:
    if found.unsettled:
        named = ", ".join(
            f"{n} ({k} requests after its last look)" for n, k in found.unsettled.items()
        )
        description = (
            f"not exact: touched after its last look, and still after looking again: {named}"
        )
    elif found.again:
        description = "exact: " + ", ".join(
            f"{name} looked at again after {found.touched_after[name]} later requests"
            for name in found.again
        )
    else:
        description = f"exact: each of {len(run.last_looks)} sets' last look followed every other"
    return AssetCheckResult(
        check_name=SETTLED,
        passed=not found.unsettled,
        description=description,
        metadata={f"{UNSETTLED}{name}": n for name, n in found.unsettled.items()},
    )
