"""The nightly budget: parsed with a clear error, the stalest sets read whole first, and a
run over budget says how stale each set is (metadata and a warning check)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import duckdb
import pytest
from dagster import DagsterInstance

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DOCUMENTS,
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
    Allotment,
    Coverage,
    SetCost,
    allot,
    costs_of,
    parse_budget,
    reserve,
    staleness_hours,
)
from tests.truth import canonical, live_rows

NOW = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)


def duckdb_rows(path: str, sql: str, *params: object) -> list[tuple]:
    """Rows of the published warehouse (the sync publishes after every run)."""
    with duckdb.connect(path, read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def test_budget_is_requests_or_minutes_at_the_rate():
    assert parse_budget(None, 2.0) is None and parse_budget(" ", 2.0) is None
    assert parse_budget("1500", 2.0) == 1500
    assert parse_budget("30m", 2.0) == 3600 and parse_budget("1.5 min", 4.0) == 360
    for bad in ("lots", "-5", "0", "10h"):
        with pytest.raises(ConfigError, match="CLINICAL_NIGHTLY_BUDGET"):
            parse_budget(bad, 2.0)


def costs(last: dict[str, datetime | None], rows: int = 2000) -> list[SetCost]:
    return [
        SetCost(e, rows, Coverage(last.get(e.name, NOW - timedelta(days=1)))) for e in ALL_ENTITIES
    ]


# Patients (and its documents) stalest, then InsuranceVerifications, then Prescriptions.
STALENESS_SPREAD = {
    PATIENTS.name: NOW - timedelta(days=3),
    PRESCRIPTIONS.name: NOW - timedelta(days=1),
    INSURANCE_VERIFICATIONS.name: NOW - timedelta(days=2),
    DOCUMENTS.name: NOW - timedelta(days=3),
}


def test_the_stalest_sets_are_read_whole_first_and_children_ride_free():
    everything = costs(STALENESS_SPREAD)
    one_set = reserve(everything) + 2000 // 100 + 3
    chosen = allot(everything, one_set, NOW)
    # Patients is stalest and fits; its documents ride in its pages at no cost.
    assert chosen.whole == {PATIENTS.name, DOCUMENTS.name}
    assert chosen.ranges == {}
    # With room for two: Prescriptions next (InsuranceVerifications then ride free).
    both = allot(everything, one_set + 23, NOW)
    assert both.whole == {
        PATIENTS.name,
        DOCUMENTS.name,
        PRESCRIPTIONS.name,
        INSURANCE_VERIFICATIONS.name,
    }
    assert allot(everything, 0, NOW) == Allotment()


def test_what_is_left_reads_key_ranges_of_the_stalest_sets_that_did_not_fit():
    everything = costs(STALENESS_SPREAD)
    one_set = reserve(everything) + 2000 // 100 + 3
    # Patients whole; 12 left: InsuranceVerifications (staler) gets 9 pages of a range.
    some = allot(everything, one_set + 12, NOW)
    assert some.whole == {PATIENTS.name, DOCUMENTS.name}
    assert some.ranges == {INSURANCE_VERIFICATIONS.name: 9}
    # No set fits whole: the stalest reads a range, documents never (no keys to range).
    tight = allot(everything, reserve(everything) + 10, NOW)
    assert tight == Allotment(frozenset(), {PATIENTS.name: 7})
    # A set read in part by this run keeps its place for the run's later steps.
    read = [
        replace(c, read=Coverage(c.read.covered_at, NOW)) if c.entity is PRESCRIPTIONS else c
        for c in everything
    ]
    assert allot(read, reserve(read) + 10, NOW - timedelta(minutes=5)).ranges == {
        PRESCRIPTIONS.name: 7
    }


def test_a_set_this_run_already_read_whole_keeps_its_place():
    """Steps of one run decide alone: a set that an earlier step read whole (its last read is
    after the run began) is counted first, so a later step cannot spend its share twice."""
    started = NOW - timedelta(minutes=5)
    last = {PRESCRIPTIONS.name: NOW, PATIENTS.name: NOW - timedelta(days=9)}
    everything = costs(last)
    one_set = reserve(everything) + 2000 // 100 + 3
    assert PRESCRIPTIONS.name in allot(everything, one_set, started).whole
    assert PATIENTS.name not in allot(everything, one_set, started).whole


def test_staleness_in_hours():
    assert staleness_hours(NOW - timedelta(hours=30), NOW) == 30.0
    assert staleness_hours(None, NOW) == float("inf")


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
