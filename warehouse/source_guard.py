"""A run is refused before any step and any request when its warehouse or its lake holds
another source's data (docs/operators/running.md, "Exit statuses": nothing ran). The loads and
extractions check again as they write (`Warehouse.check_source`, `Lake.record_source`), for
runs that no command started: the schedule's, the UI's."""

from __future__ import annotations

import contextlib
from pathlib import Path

import duckdb

from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.publish import working_path


def refuse_another_source(
    warehouse_path: str | Path, lake_root: str | Path, base_url: str, customer: str
) -> None:
    """SourceMismatch, naming what each holds, when the lake or the warehouse (its working
    copy, else the published file) was built from another service or customer. Reads only:
    the caller holds the writer lock, so what it reads stays true until its run writes."""
    for path in (working_path(warehouse_path), Path(warehouse_path)):
        if path.exists():
            with (
                Warehouse(path, read_only=True) as wh,
                contextlib.suppress(duckdb.CatalogException),
            ):
                wh.check_source(base_url, customer)  # no ops.source yet: nothing to refuse
            break
    Lake(lake_root).check_source(base_url, customer)
