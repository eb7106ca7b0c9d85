"""The incremental models against their whole build, night after night: the sandbox's store
changes a fifth of its records a day (claims and verifications moved to other prescriptions,
patients and physicians renamed, records deleted), each night goes down the nightly's loading
path and builds the models from the changes alone, and every model's table must equal its
SELECT over the clinical tables beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import year_of_nights as year
from connectors.sandbox.store import Store
from tests.warehouse_records import analytics_rows
from warehouse import models
from warehouse.load import Warehouse
from warehouse.publish import working_path

NIGHTS = 6
DAY = {"insert_fraction": 0.03, "update_fraction": 0.2, "delete_fraction": 0.03}


def moved(work: Path) -> dict[str, int]:
    """What the nights changed that a model's incremental build must follow elsewhere."""
    with Warehouse(work, read_only=True) as wh:
        (claims,) = wh.con.execute(
            "SELECT count(*) FROM analytics.changes WHERE entity = 'Claims' "
            "AND list_contains(changed_columns, 'prescription_id')"
        ).fetchone()
        (patients,) = wh.con.execute(
            "SELECT count(*) FROM analytics.changes WHERE entity = 'Patients' "
            "AND list_has_any(changed_columns, ['first_name', 'last_name'])"
        ).fetchone()
        (deleted,) = wh.con.execute(
            "SELECT count(*) FROM analytics.changes WHERE entity = 'Prescriptions' "
            "AND change = 'deleted'"
        ).fetchone()
    return {"claims moved": claims, "patients renamed": patients, "prescriptions gone": deleted}


@pytest.mark.timeout(600)
def test_every_night_the_incremental_models_equal_their_whole_build(tmp_path, monkeypatch):
    builds: list[bool] = []
    run = models._run

    def counted(*args, **kwargs):
        builds.append(args[-1])  # whole: --full-refresh
        return run(*args, **kwargs)

    monkeypatch.setattr(models, "_run", counted)
    store = Store(seed=11, scale=0.2)
    log = year.DayLog(store)
    # a file name that is no bare SQL identifier: the macros name its catalog quoted
    lake, published = year.Lake(tmp_path / "lake"), tmp_path / "clinic-a.duckdb"
    year.night(0, year.every_record(store), store.now, lake, published)
    for number in range(1, NIGHTS + 1):
        store.advance(seconds=86400, **DAY)
        year.night(number, log.take(), store.now, lake, published)
        with Warehouse(working_path(published), read_only=True) as wh:
            for name, (table, query) in analytics_rows(wh.con).items():
                assert table == query, f"night {number}: {name}"
    assert builds == [True] + [False] * NIGHTS  # the first build whole, then the changes
    assert all(moved(working_path(published)).values()), moved(working_path(published))
