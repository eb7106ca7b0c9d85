"""Runs of `clinical-sync` whose process died, found by whoever comes first: `status` here
(`sync` finds them itself, in pipelines/runner.py)."""

from __future__ import annotations

import os
from pathlib import Path

from cli.output import tell
from connectors.clinical_records.errors import ConfigError
from pipelines import home


def end_orphans_of(warehouse: str | Path | None, tenants_file: Path | None = None) -> None:
    """Runs of `clinical-sync` whose process died, found by `status` when it comes first:
    recorded killed in their own warehouses (`run_record.end_orphans`), their alerts sent,
    said on stderr. Only where a sync has made the warehouse's Dagster instance: `status`
    creates none."""
    if home.made_dagster_home(warehouse) is None:
        return
    from pipelines.run_record import Place, end_orphans
    from pipelines.webhook import webhook_from_env

    try:
        webhook = webhook_from_env(os.environ)
    except ConfigError:
        webhook = None  # `sync` names the variable; `status` still shows what it can
    here = Place(str(warehouse or home.warehouse_path()), home.lake_root())
    with home.instance(warehouse) as instance:
        for run_id, place in end_orphans(instance, here, tenants_file, webhook, say=lambda _: None):
            tell(
                f"run {run_id[:8]} had died without finishing: recorded killed in "
                f"{place.warehouse}'s ops.sync_runs (its next sync publishes it)"
            )
