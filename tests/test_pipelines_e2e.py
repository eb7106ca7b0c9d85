"""End to end: the Dagster assets against a sandbox, into a DuckDB file and a Parquet lake.

The warehouse must equal the sandbox's ground truth after canonicalisation (the warehouse's
own `normalise` applied to the truth records): same keys, same values.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import pytest
from dagster import materialize

from connectors.clinical_records.catalogue import (
    ENTITY_SETS,
    FAMILIES,
    PAGE_SIZE,
    EntitySet,
    entity,
)
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.assets import build_assets
from pipelines.keys import lake_key
from pipelines.runner import SyncReport, resources_from_env, sync
from sync import extract
from tests.truth import canonical, live_rows
from warehouse.ident import qualified, quote
from warehouse.lake import Lake

pytestmark = pytest.mark.e2e


class Target:
    """A tmp lake and warehouse synced from one sandbox."""

    def __init__(self, server: SandboxServer, root: Path) -> None:
        self.server = server
        self.lake = str(root / "lake")
        self.warehouse = str(root / "warehouse.duckdb")
        self.env = {
            **server.env(),
            "CLINICAL_RATE_LIMIT": "1000",
            "CLINICAL_BURST": "200",
            "CLINICAL_LIMITER_PATH": str(root / "ratelimit.sqlite"),
        }

    def sync(self, **options) -> SyncReport:
        report = sync(self.env, lake_root=self.lake, warehouse_path=self.warehouse, **options)
        assert report.success, report.failure
        return report

    def truth(self, ent: EntitySet) -> dict[object, dict]:
        with self.server.store.lock:
            records = self.server.store.ground_truth()[ent.name]
        return canonical(ent, records)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with duckdb.connect(self.warehouse, read_only=True) as con:
            con.execute("SET TimeZone = 'UTC'")
            return con.execute(sql, params or []).fetchall()

    def live(self, ent: EntitySet) -> dict[object, dict]:
        return live_rows(self.warehouse, ent)

    def deleted_keys(self, ent: EntitySet) -> set:
        rows = self.query(
            f"SELECT {quote(ent.key)} FROM {qualified('clinical', ent.table)} "
            'WHERE "_deleted_at" IS NOT NULL'
        )
        return {r[0] for r in rows}

    def watermark(self, ent: EntitySet) -> str | None:
        rows = self.query(
            'SELECT "watermark" FROM "ops"."sync_state" WHERE "entity" = ?', [ent.name]
        )
        return rows[0][0] if rows else None


def assert_equal_to_truth(target: Target, ent: EntitySet) -> None:
    truth, live = target.truth(ent), target.live(ent)
    assert live.keys() == truth.keys(), ent.name
    differing = [k for k in truth if truth[k] != live[k]]
    assert not differing, f"{ent.name}: {len(differing)} records differ, e.g. {differing[:3]}"


def assert_truth_contained(target: Target, ent: EntitySet) -> None:
    """Every current source record is in the warehouse with its current values."""
    truth, live = target.truth(ent), target.live(ent)
    missing = truth.keys() - live.keys()
    assert not missing, f"{ent.name}: {len(missing)} records missing"
    differing = [k for k in truth if truth[k] != live[k]]
    assert not differing, f"{ent.name}: {len(differing)} records differ"


@pytest.fixture(scope="module")
def mid_sandbox() -> Iterator[SandboxServer]:
    """Big enough that the nightly cost is visibly a fraction of the full one."""
    with SandboxServer(SandboxConfig(seed=23, scale=0.5)) as server:
        yield server


def test_full_then_nightly_then_snapshot_equal_the_source(mid_sandbox, tmp_path):
    target = Target(mid_sandbox, tmp_path)
    full = target.sync()
    for ent in ENTITY_SETS:
        assert full.entities[ent.name]["mode"] == "snapshot"
        assert_equal_to_truth(target, ent)
    outcomes = {(c.table, c.name): c for c in full.checks}
    for ent in ENTITY_SETS:
        assert outcomes[(ent.table, "no_rejects")].passed
        count = outcomes[(ent.table, "row_count_matches_source")]
        with mid_sandbox.store.lock:
            source = len(mid_sandbox.store.ground_truth()[ent.name])
        assert count.passed and count.metadata["source_count"] == source
    claims_refs = outcomes[("claims", "references_found")]
    assert not claims_refs.passed and claims_refs.severity == "WARN"
    assert claims_refs.metadata["dangling prescription_id"] > 0
    assert claims_refs.metadata["dangling"] >= claims_refs.metadata["dangling prescription_id"]
    assert all(c.severity == "WARN" for c in full.failed_checks()), full.check_lines()

    with mid_sandbox.store.lock:
        changes = mid_sandbox.store.advance(
            seconds=86400, insert_fraction=0.01, update_fraction=0.01, delete_fraction=0.01
        )
    assert sum(c["deleted"] for c in changes.values()) > 0

    nightly = target.sync()
    outcomes = {(c.table, c.name): c for c in nightly.checks}
    for ent in ENTITY_SETS:  # exact every run: updates and hard deletes of every set
        assert_equal_to_truth(target, ent)
        count = outcomes[(ent.table, "row_count_matches_source")]  # increments compared too
        assert count.passed and count.metadata["source_count"] == len(target.truth(ent))
    # The sets without updated_at are read whole, their children riding in their pages.
    assert nightly.entities["InsuranceVerifications"]["mode"] == "snapshot"
    assert nightly.entities["Claims"]["mode"] == "incremental"
    spent = {n: int(float(r["requests"])) for n, r in nightly.entities.items()}
    assert spent["Claims"] < int(float(full.entities["Claims"]["requests"])), spent
    assert spent["Documents"] == 0, spent  # they came in the patients' pages

    snapshot = target.sync(full=True)
    for ent in ENTITY_SETS:
        assert_equal_to_truth(target, ent)
        gone = changes[ent.name]["deleted"]
        assert len(target.deleted_keys(ent)) == gone, ent.name
        assert (
            snapshot.entities[ent.name]["rows_soft_deleted"]
            + nightly.entities[ent.name]["rows_soft_deleted"]
            == gone
        )

    # The analytics model joins every live claim whose prescription exists.
    (expected,) = target.query(
        "SELECT count(*) FROM clinical.claims c JOIN clinical.prescriptions p "
        "ON c.prescription_id = p.id "
        "WHERE c._deleted_at IS NULL AND p._deleted_at IS NULL"
    )[0:1]
    (joined,) = target.query("SELECT count(*) FROM analytics.prescription_claims")[0:1]
    claims = target.truth(entity("Claims")).values()
    prescriptions = target.truth(entity("Prescriptions")).keys()
    assert joined == expected
    assert joined[0] == sum(1 for c in claims if c["prescription_id"] in prescriptions)
    dangling = [c for c in claims if c["prescription_id"] not in prescriptions]
    assert dangling, "the sandbox has dangling claims; the check must see them"


def test_backfill_and_an_unloaded_extraction_leave_the_watermark(fresh_sandbox, tmp_path):
    target = Target(fresh_sandbox, tmp_path)
    target.sync()
    claims, appointments = entity("Claims"), entity("Appointments")
    marks = {e.name: target.watermark(e) for e in (claims, appointments)}

    with fresh_sandbox.store.lock:
        fresh_sandbox.store.advance(seconds=86400, delete_fraction=0.0)

    # Backfill a date range: rows re-read, watermark untouched.
    report = target.sync(
        only=["claims"], backfill_from=date(2020, 1, 1), backfill_to=date(2100, 1, 1)
    )
    assert report.entities["Claims"]["mode"] == "backfill"
    assert report.entities["Claims"]["rows_fetched"] == len(target.truth(claims))
    assert target.watermark(claims) == marks["Claims"]
    assert_truth_contained(target, claims)

    # An extraction whose load never ran (a killed run) commits nothing.
    resources = resources_from_env(target.env, target.lake, target.warehouse)
    done = materialize(build_assets(), resources=resources, selection=[lake_key(appointments)])
    assert done.success
    assert target.watermark(appointments) == marks["Appointments"]
    # The next run resumes from the committed watermark and loses nothing.
    target.sync(only=["Appointments"])
    assert_truth_contained(target, appointments)
    assert target.watermark(appointments) > marks["Appointments"]


def test_a_record_updated_in_the_future_does_not_carry_the_watermark_there(fresh_sandbox, tmp_path):
    """A typo or a sentinel (9999-12-31) in one record's cursor would hold the watermark
    there, and every later increment would skip what changed until then."""
    appointments = entity("Appointments")
    template = next(iter(fresh_sandbox.store.ground_truth()["Appointments"]))
    fresh_sandbox.control().plant(
        "Appointments", {**template, "id": "apt-from-9999", "updated_at": "9999-12-31T00:00:00Z"}
    )
    target = Target(fresh_sandbox, tmp_path)
    began = datetime.now(UTC)
    target.sync(only=["Appointments"])
    assert "apt-from-9999" in target.live(appointments)
    mark = datetime.fromisoformat(target.watermark(appointments))
    assert began <= mark <= datetime.now(UTC)


def test_an_extraction_of_many_files_loads_as_one(fresh_sandbox, tmp_path, monkeypatch):
    """Records normalised in chunks and gathered into several lake files: only the last file
    carries the watermark and ends the snapshot, and the load takes them all as one."""
    monkeypatch.setattr(extract, "NORMALISE_ROWS", 1)  # every page normalised alone
    monkeypatch.setattr(extract, "FILE_ROWS", 250)  # a file is written once 250 rows gathered
    target = Target(fresh_sandbox, tmp_path)
    target.sync(full=True)
    with fresh_sandbox.store.lock:
        changes = fresh_sandbox.store.advance(seconds=86400, delete_fraction=0.02)
    report = target.sync(full=True)

    lake = Lake(target.lake)
    written: dict[str, list] = {}  # the second run's files per set, oldest first
    for ent in ENTITY_SETS:
        assert_equal_to_truth(target, ent)
        assert len(target.deleted_keys(ent)) == changes[ent.name]["deleted"], ent.name
        paths = [p for p in lake.files(ent) if Lake.info(p).run_id == report.run_id]
        infos = written[ent.name] = [Lake.info(p) for p in paths]
        keys = {k for p in paths for k in lake.read(p)[0].column(ent.key).to_pylist()}
        assert keys == target.truth(ent).keys(), ent.name  # and re-read versions besides
        *earlier, last = infos
        assert all(250 <= i.rows < 250 + PAGE_SIZE for i in earlier), ent.name
        assert last.snapshot_complete and not any(i.snapshot_complete for i in earlier)
        assert not any(i.watermark for i in earlier), ent.name
        if ent.cursor is not None:
            assert last.watermark == target.watermark(ent), ent.name
    assert len(written["Appointments"]) >= 2  # pages gathered in several files


@pytest.mark.parametrize("rotation", [0, 2])
def test_each_family_loads_before_the_next_family_is_read(fresh_sandbox, tmp_path, rotation):
    """Loads first (`dagster/priority` on the table assets): a family's tables are loaded
    right after its extraction, before the next family's, so their CPU falls among requests
    the rate limit spaces anyway and not all after the last request. Rotated (`sync
    --all-tenants` gives each tenant its place in the file), the reads start `rotation`
    families on, the rest in the same order, and every set still lands equal to the source."""
    from dagster import DagsterEventType, DagsterInstance

    target = Target(fresh_sandbox, tmp_path)
    with DagsterInstance.ephemeral() as instance:
        report = target.sync(instance=instance, read_rotation=rotation)
        started = [
            e.step_key
            for e in instance.all_logs(report.run_id, of_type=DagsterEventType.STEP_START)
        ]
    extractions = [i for i, key in enumerate(started) if key.startswith("extract_")]
    assert len(extractions) == len(FAMILIES), started
    default = sorted(f"extract_{family[0].table}" for family in FAMILIES)
    assert [started[i] for i in extractions] == default[rotation:] + default[:rotation]
    for family in FAMILIES:
        read = started.index(f"extract_{family[0].table}")
        next_read = min((i for i in extractions if i > read), default=len(started))
        loads = [started.index(f"clinical__{e.table}") for e in family]
        assert all(read < at < next_read for at in loads), (family[0].name, started)
    for ent in ENTITY_SETS:
        assert_equal_to_truth(target, ent)
