"""The nightly budget in a run: a run over budget reads the stalest sets whole and says how
stale each set is (metadata and a warning check); its decisions: tests/sync/test_budget.py."""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb
import pytest
from dagster import DagsterInstance

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PRESCRIPTIONS,
)
from connectors.clinical_records.errors import ConfigError
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.checks import STALENESS
from pipelines.runner import sync
from sync.budget import (
    PER_SET,
    costs_of,
    reserve,
)
from tests.truth import canonical, live_rows

NOW = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)


def duckdb_rows(path: str, sql: str, *params: object) -> list[tuple]:
    """Rows of the published warehouse (the sync publishes after every run)."""
    with duckdb.connect(path, read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


@pytest.fixture
def synced(tmp_path, request):
    """A sandbox (its values profile the test's parameter, default "spec"), a Dagster
    instance, and a warehouse after a full sync of it."""
    paths = {"lake_root": str(tmp_path / "lake"), "warehouse_path": str(tmp_path / "w.duckdb")}
    config = SandboxConfig(seed=11, scale=0.2, values=getattr(request, "param", "spec"))
    with SandboxServer(config) as srv, DagsterInstance.ephemeral() as i:
        env = {
            **srv.env(),
            "CLINICAL_RATE_LIMIT": "500",
            "CLINICAL_BURST": "100",
            "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        }
        assert sync(env, instance=i, full=True, **paths).success
        yield srv, i, env, paths


@pytest.mark.e2e
def test_a_nightly_run_over_budget_reads_the_stalest_and_says_how_stale(synced):
    srv, i, env, paths = synced
    # Room for the increments and small sets, and for one of the two big blind sets.
    sized = costs_of(ALL_ENTITIES, srv.store.counts(), {})
    pages = {c.entity.name: c.pages for c in sized}
    room = reserve(sized) + max(pages[PATIENTS.name], pages[PRESCRIPTIONS.name])
    tight = {**env, "CLINICAL_NIGHTLY_BUDGET": str(room)}
    first = sync(tight, instance=i, **paths)
    assert first.success, first.failure
    modes = {n: str(f["mode"]) for n, f in first.entities.items()}
    whole = {n for n in (PATIENTS.name, PRESCRIPTIONS.name) if modes[n] == "snapshot"}
    assert len(whole) == 1, modes
    waiting = ({PATIENTS.name, PRESCRIPTIONS.name} - whole).pop()
    assert modes[waiting] == "incremental"
    assert float(first.entities[waiting]["source_staleness_hours"]) >= 0
    assert float(first.entities[next(iter(whole))]["source_staleness_hours"]) < 0.1
    stale = [c for c in first.checks if c.name == STALENESS]
    assert stale and all(c.severity == "WARN" for c in stale)
    ((worst,),) = duckdb_rows(
        paths["warehouse_path"],
        'SELECT "max_staleness_hours" FROM "ops"."sync_runs" WHERE "run_id" = ?',
        first.run_id,
    )
    assert worst == max(float(first.entities[n]["source_staleness_hours"]) for n in modes)
    assert worst > 0
    # The next run reads the one that waited: the stalest first.
    second = sync(tight, instance=i, **paths)
    assert str(second.entities[waiting]["mode"]) == "snapshot", second.entities
    with pytest.raises(ConfigError, match="CLINICAL_NIGHTLY_BUDGET"):
        sync({**env, "CLINICAL_NIGHTLY_BUDGET": "plenty"}, **paths)


@pytest.mark.e2e
@pytest.mark.parametrize("synced", ["spec", "wide"], indirect=True)
def test_over_budget_key_ranges_rotate_until_every_record_is_read(synced):
    """A budget too small for any set without updated_at whole: each night reads a key
    range of the stalest, from where the last one ended, its updates and deletes with it.
    When the rotation comes round, the set equals the source, and its staleness counts
    from when the rotation began. With the wide values the keys are any text (leading
    zeros, "00123" beside "123") or any Int32: ranges run in the service's order of them."""
    srv, i, env, paths = synced
    srv.store.advance(seconds=3600, update_fraction=0.05, delete_fraction=0.02)
    sized = costs_of(ALL_ENTITIES, srv.store.counts(), {})
    smallest = min(c.pages for c in sized if c.entity.name in BLIND_SETS)
    budget = reserve(sized) + PER_SET + (smallest - PER_SET) // 2  # half the smallest
    tight = {**env, "CLINICAL_NIGHTLY_BUDGET": str(budget)}
    first = sync(tight, instance=i, **paths)
    assert first.success, first.failure
    ranged = [n for n, f in first.entities.items() if str(f["mode"]) == "range"]
    assert len(ranged) == 1, {n: f["mode"] for n, f in first.entities.items()}
    name = ranged[0]
    entity = next(e for e in ALL_ENTITIES if e.name == name)
    began = state(paths, name)["range_read_at"]
    for night in range(2, 8):
        if state(paths, name)["range_position"] is None:
            break
        report = sync(tight, instance=i, **paths)
        assert report.success, report.failure
        assert str(report.entities[name]["mode"]) == "range", (night, report.entities)
    else:
        pytest.fail(f"{name}'s key ranges did not come round in 7 nights")
    assert night > 2  # it took several nights: each read only a range
    done = state(paths, name)
    assert done["covered_at"] == began  # every record read since the rotation began
    want = canonical(entity, srv.store.ground_truth()[name])
    have = live_rows(paths["warehouse_path"], entity)
    assert want.keys() == have.keys()
    assert [k for k in want if want[k] != have[k]] == []
    # The rotation done, the stalest set is another: its turn next.
    after = sync(tight, instance=i, **paths)
    assert str(after.entities[name]["mode"]) != "range"


BLIND_SETS = {PATIENTS.name, PRESCRIPTIONS.name, INSURANCE_VERIFICATIONS.name}


def state(paths: dict[str, str], name: str) -> dict[str, object]:
    columns = ("range_position", "range_read_at", "covered_at")
    (row,) = duckdb_rows(
        paths["warehouse_path"],
        f'SELECT {", ".join(columns)} FROM "ops"."sync_state" WHERE "entity" = ?',
        name,
    )
    return dict(zip(columns, row, strict=True))
