"""A run's row in ops.sync_runs, written once from how the run ended, into its own
warehouse's working copy and its lake (docs/ARCHITECTURE.md, "The record of a run").

Whoever learns how a run ended writes it; the first to write it wins:
- the run's publish step, the last step of a run whose every write succeeded: `success`, so
  the copy it publishes holds it, and `failed` in its place if the publication then fails
  (`finishing`);
- the process that ran a run that failed: `clinical-sync` for the runs it executes, the
  daemon's `mark_failed_runs` sensor for the deployment's (pipelines/run_failures.py);
- whoever finds a run whose process died (SIGKILL, power loss): the next `clinical-sync sync`
  or `status` (`end_orphans`): `killed`, in the warehouse of the run's own tenant.
A failed or killed run publishes nothing: its row reaches the published copy with the next
run's publication.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterInstance, DagsterRun

from connectors.clinical_records.catalogue import ALL_ENTITIES
from connectors.clinical_records.errors import ConfigError
from pipelines import tenants
from pipelines.alerts import conclude
from pipelines.keys import CLINICAL_GROUP, FULL_JOB, LAKE_GROUP
from pipelines.liveness import release_orphans, run_started_at
from pipelines.partitions import PARTITION_TAG
from pipelines.verdict import died
from pipelines.webhook import Webhook
from sync.state import LOCK_WAIT_SECONDS
from warehouse.errors import WarehouseLocked
from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.publish import working_copy, working_path
from warehouse.runs import FAILED, KILLED, SUCCESS, RunEnding, run_row

log = logging.getLogger(__name__)

KILLED_WHY = "its clinical-sync process ended without finishing"


@dataclass(frozen=True)
class Place:
    """Where a run wrote: its warehouse (the published path), its lake, and the source it
    read (base URL, customer) when known: a run's row never goes into another source's
    warehouse. `tenant`: whose, when there are tenants."""

    warehouse: str
    lake: str
    source: tuple[str, str] | None = None
    tenant: str | None = None


def entities_of(selection: Collection[AssetKey] | None) -> tuple[str, ...]:
    """The entity sets a run's asset selection reads or loads (none: not known)."""
    tables = {
        key.path[-1] for key in selection or () if key.path[0] in (LAKE_GROUP, CLINICAL_GROUP)
    }
    return tuple(e.name for e in ALL_ENTITIES if e.table in tables)


def ending_of(
    instance: DagsterInstance,
    run: DagsterRun,
    status: str,
    message: str | None = None,
    finished_at: datetime | None = None,
) -> RunEnding:
    """A Dagster run's ending as its row says it: its start, the sets it was asked for, full
    when it ran the full job."""
    return RunEnding(
        run.run_id,
        status,
        run_started_at(instance, run.run_id),
        finished_at,
        entities_of(run.asset_selection),
        run.job_name == FULL_JOB,
        message,
    )


def record_ending(
    place: Place, ending: RunEnding, *, wait: float = LOCK_WAIT_SECONDS, correct: bool = False
) -> bool:
    """Write the run's row into the working copy and the lake; False when there is no
    warehouse yet (nothing of the run is in it), it belongs to another source, someone wrote
    the row first (`correct`: its writer corrects it), or the warehouse stayed locked past
    `wait`."""
    if not (Path(place.warehouse).exists() or working_path(place.warehouse).exists()):
        return False
    try:
        path = working_copy(place.warehouse, wait=wait)
        with Warehouse(path, wait=wait) as wh:
            wh.ensure_schema()
            if place.source is not None and wh.source() not in (None, place.source):
                return False
            if not wh.end_run(ending, correct=correct):
                return False
            row = run_row(wh.con, ending.run_id)
    except WarehouseLocked:
        log.warning(
            "run %s %s; the warehouse stayed locked, so ops.sync_runs does not say so yet",
            ending.run_id,
            ending.status,
        )
        return False
    if row is not None:
        Lake(place.lake).record_run(row)
    return True


@contextmanager
def finishing(context: Any, place: Place, full: bool) -> Iterator[None]:
    """The run's own ending, `success`, written by its last write step before the block (its
    publication, which then carries it); `failed` in its place when the block fails."""
    run = context.run
    ending = RunEnding(
        run.run_id,
        SUCCESS,
        run_started_at(context.instance, run.run_id),
        entities=entities_of(
            run.asset_selection or context.job_def.asset_layer.selected_asset_keys
        ),
        full_snapshot=full,
    )
    record_ending(place, ending)
    try:
        yield
    except Exception as error:
        why = f"{context.op.name}: {type(error).__name__} (its message is in the run's log)"
        record_ending(place, replace(ending, status=FAILED, message=why), correct=True)
        raise


def failed(instance: DagsterInstance, run_id: str, place: Place, message: str) -> bool:
    """A run that failed, as the process that ran it or the sensor learnt it."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return False
    return record_ending(place, ending_of(instance, run, FAILED, message))


def place_of(run: DagsterRun, here: Place, tenants_file: Path | None) -> Place:
    """Where `run` wrote: its own tenant's warehouse, lake and source (by its partition), or
    `here` for a run of no tenant. ConfigError when its tenant is not in the file any more."""
    name = run.tags.get(PARTITION_TAG)
    if name is None or tenants_file is None:
        return here
    tenant = tenants.load(tenants_file).get(name)
    return Place(str(tenant.warehouse), str(tenant.lake), (tenant.base_url, tenant.customer), name)


def end_orphans(
    instance: DagsterInstance,
    here: Place,
    tenants_file: Path | None,
    webhook: Webhook | None,
    say: Callable[[str], object] = log.warning,
) -> list[tuple[str, Place]]:
    """Runs of `clinical-sync` on this host whose process died: released in Dagster, recorded
    killed in their own warehouses (the warehouse of the run's tenant, not the caller's), and
    their one message sent under their own tenant's name. Each (run id, place) found."""
    found = []
    for orphan in release_orphans(instance):
        run = orphan.run
        try:
            place = place_of(run, here, tenants_file)
        except ConfigError as error:
            say(f"run {run.run_id} had died without finishing; its tenant is unknown: {error}")
            continue
        whose = f" (tenant {place.tenant})" if place.tenant else ""
        ending = ending_of(instance, run, KILLED, KILLED_WHY, orphan.last_seen)
        recorded = record_ending(place, ending, wait=0 if place != here else LOCK_WAIT_SECONDS)
        say(
            f"run {run.run_id}{whose} had died without finishing: slots freed"
            + (", recorded killed in ops.sync_runs" if recorded else "")
        )
        conclude(
            died(run.run_id, run.job_name, KILLED_WHY),
            warehouse=place.warehouse,
            webhook=webhook,
            instance=instance,
            tenant=place.tenant,
        )
        found.append((run.run_id, place))
    return found


def source_of(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(base URL, customer) from the environment's settings, when they are complete."""
    from connectors.clinical_records.settings import Settings

    try:
        settings = Settings.from_env(env)
    except ConfigError:
        return None
    return settings.base_url, settings.customer
