"""The reliability suite's harness: a sandbox and a target under tmp_path, the real
`clinical-sync` command as a subprocess, the comparison with the ground truth, and the soak
ledger (tests/reliability/ledger.py) printed at the end of the session.

Size: CI runs each case small; `make soak` sets CLINICAL_SOAK=1 and every case grows 10x.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DOCUMENTS,
    ENTITY_SETS,
    PATIENTS,
    EntitySet,
    Strategy,
)
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.runner import SyncReport
from pipelines.runner import sync as run_sync
from sync.reconcile_mark import Blind
from tests.reliability.ledger import LEDGER, SIZE, WORKER_OUTPUT, Ledger
from tests.truth import canonical, live_rows
from warehouse.ident import qualified, quote
from warehouse.lake import Lake

REPO_ROOT = Path(__file__).resolve().parents[2]


BASE_SCALE = 0.04  # about 900 records over the eight sets at CI size
SYNC_TIMEOUT = 150 * SIZE


@pytest.fixture
def ledger() -> Ledger:
    LEDGER.cases += 1
    return LEDGER


def pytest_collection_modifyitems(config, items) -> None:
    """Soak cases run 10x longer than pyproject's per-test timeout allows; give them room."""
    if SIZE == 1:
        return
    for item in items:
        if item.get_closest_marker("reliability") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(300 * SIZE))


def pytest_sessionfinish(session) -> None:
    """On a worker of `pytest -n` (make test, make soak): its figures to the controller,
    which adds every worker's and prints the table (tests/conftest.py)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None and LEDGER.cases:
        output[WORKER_OUTPUT] = LEDGER.as_dict()


# -- a sandbox and a target ------------------------------------------------------------------


def sandbox_config(seed: int, scale: float = BASE_SCALE, **values: object) -> SandboxConfig:
    return SandboxConfig(seed=seed, scale=scale * SIZE, **values)  # type: ignore[arg-type]


@dataclass
class Target:
    """A lake, a warehouse, a Dagster home and a limiter file for one sandbox, under `root`."""

    server: SandboxServer
    root: Path
    rate: str = "1000"
    burst: str = "200"
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def warehouse(self) -> Path:
        return self.root / "warehouse.duckdb"

    @property
    def lake(self) -> Path:
        return self.root / "lake"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    def env(self) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("CLINICAL_")}
        return {
            **inherited,
            **self.server.env(),
            "CLINICAL_RATE_LIMIT": self.rate,
            "CLINICAL_BURST": self.burst,
            "CLINICAL_LIMITER_PATH": str(self.root / "ratelimit.sqlite"),
            "CLINICAL_READ_TIMEOUT": "20",
            "WAREHOUSE_PATH": str(self.warehouse),
            "LAKE_ROOT": str(self.lake),
            "DAGSTER_HOME": str(self.dagster_home),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli.main", *args]

    def start(self, *args: str, log: Path | None = None) -> subprocess.Popen:
        """`clinical-sync <args>` in a child process (stdout and stderr to `log`)."""
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        try:
            return subprocess.Popen(
                self.command(*args),
                env=self.env(),
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
            )
        finally:
            if log:
                out.close()  # the child holds its own copy

    def run(self, *args: str, timeout: float = SYNC_TIMEOUT) -> subprocess.CompletedProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            self.command(*args),
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sync(self, *args: str, timeout: float = SYNC_TIMEOUT) -> subprocess.CompletedProcess:
        """`clinical-sync sync <args>`, which must succeed within `timeout` seconds."""
        try:
            done = self.run("sync", *args, timeout=timeout)
        except subprocess.TimeoutExpired as stuck:
            pytest.fail(f"sync {args} still running after {timeout} s:\n{stuck.stderr!r}")
        assert done.returncode == 0, f"sync {args} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def sync_in_process(self, **options: object) -> SyncReport:
        """The same run as `clinical-sync sync` (pipelines.runner), in this process with an
        ephemeral Dagster instance: the cases that need no process of their own save the
        interpreter start and the instance storage."""
        env = {k: v for k, v in self.env().items() if k.startswith("CLINICAL_")}
        report = run_sync(
            env,
            lake_root=str(self.lake),
            warehouse_path=str(self.warehouse),
            log_level="WARNING",
            **options,  # type: ignore[arg-type]
        )
        assert report.success, f"sync {options} failed: {report.failure}"
        return report

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            con.execute("SET TimeZone = 'UTC'")
            return con.execute(sql, list(params)).fetchall()


# -- the comparison with the ground truth -----------------------------------------------------


def truth(server: SandboxServer) -> dict[str, list[dict]]:
    with server.store.lock:
        return server.store.ground_truth()


def live(target: Target, entity: EntitySet) -> dict[object, dict]:
    return live_rows(target.warehouse, entity)


def duplicates(target: Target, entity: EntitySet) -> int:
    """Keys held more than once in a clinical table (live or soft-deleted)."""
    ((count,),) = target.query(
        f"SELECT count(*) - count(DISTINCT {quote(entity.key)}) "
        f"FROM {qualified('clinical', entity.table)}"
    )
    return int(count)


@dataclass
class Comparison:
    """What one comparison found, entity set by entity set."""

    compared: int = 0
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)  # records, by DIFFERENCES kind

    def add(self, entity: EntitySet, kind: str, keys: Sequence[object]) -> None:
        if keys:
            self.counts[kind] += len(keys)
            shown = ", ".join(repr(k) for k in list(keys)[:3])
            self.problems.append(f"{entity.name}: {len(keys)} {kind} (e.g. {shown})")

    def record(self, ledger: Ledger) -> None:
        ledger.records_compared += self.compared
        ledger.mismatches += len(self.problems)
        ledger.differences.update(self.counts)

    def __bool__(self) -> bool:
        return not self.problems


# What a run promises about an entity set, by the strategy it synced with (docs/ARCHITECTURE.md, Incremental sync).
PROMISES: dict[Strategy, frozenset[str]] = {
    Strategy.SNAPSHOT: frozenset({"missing", "extra", "values"}),
    Strategy.CURSOR: frozenset({"missing", "values"}),
    Strategy.CREATED: frozenset({"missing"}),
    Strategy.PERIODIC_SNAPSHOT: frozenset(),
}


def compare(
    target: Target,
    source: Mapping[str, list[dict]] | None = None,
    *,
    entities: Sequence[EntitySet] = ENTITY_SETS,
    exact: bool = True,
) -> Comparison:
    """The warehouse's live rows against the truth: missing, extra, differing, duplicated.

    `exact=False` checks what an incremental run promises by strategy: snapshot sets equal,
    cursor sets hold every current record (a hard delete waits for a snapshot), created-only
    sets hold every new key (an update waits for the periodic snapshot).
    """
    source = source if source is not None else truth(target.server)
    found = Comparison()
    for entity in entities:
        want = canonical(entity, source[entity.name])
        have = live(target, entity)
        found.compared += len(want)
        found.add(entity, "duplicated", ["*"] * duplicates(target, entity))
        promised = PROMISES[Strategy.SNAPSHOT if exact else entity.strategy]
        if "missing" in promised:
            found.add(entity, "missing", sorted(want.keys() - have.keys(), key=str))
        if "extra" in promised:
            found.add(entity, "extra", sorted(have.keys() - want.keys(), key=str))
        if "values" in promised:
            differing = [k for k in want if k in have and want[k] != have[k]]
            found.add(entity, "stale", differing)
    return found


def assert_matches(comparison: Comparison, ledger: Ledger) -> None:
    comparison.record(ledger)
    assert comparison, "warehouse differs from the source:\n" + "\n".join(comparison.problems)


def assert_lake_sound(target: Target) -> None:
    """Every data file reads; no batch is loaded twice; nothing under `_tmp/` counts."""
    lake = Lake(target.lake)
    batch_ids = []
    for ent in ALL_ENTITIES:
        for path in lake.files(ent):
            table, info = lake.read(path)  # raises on a corrupt file
            assert table.num_rows == info.rows, path
            batch_ids.append(info.batch_id)
    for path in (target.lake / "_rejects").rglob("*.parquet"):
        pq.read_table(path)
    assert len(batch_ids) == len(set(batch_ids))
    loaded = target.query('SELECT "batch_id", "file" FROM "ops"."loaded_batches"')
    assert len(loaded) == len({b for b, _ in loaded}), "a batch was loaded twice"
    assert len(loaded) == len({f for _, f in loaded}), "a file was loaded twice"
    assert {b for b, _ in loaded} <= set(batch_ids), "a loaded batch is not a lake file"
    assert not any("_tmp" in f for _, f in loaded)


# -- the comparison with a drifting source ---------------------------------------------------


def drifted(server: SandboxServer, since: int, *, rewrites: bool = False) -> dict[str, set[str]]:
    """Per set, the keys (as text) drift changed since change number `since`; `rewrites`:
    only those updated without moving their change cursor's value (a date: the same day)."""
    keys: dict[str, set[str]] = {e.name: set() for e in ALL_ENTITIES}
    for change in server.control().changes()[since:]:
        if not rewrites or not change["cursor_moved"]:
            keys[change["entity"]].add(str(change["key"]))
    return keys


def assert_equal_to_source(
    target: Target,
    ledger: Ledger,
    *,
    since: int,
    modes: dict[str, str],
    blind: Mapping[str, str] | None = None,
) -> None:
    """Live rows equal the source now: no key missing, extra or held twice, no value stale.
    A set the run skipped is not compared; a set read by `created_at` increments is
    compared by key (an update waits for its snapshot: docs/sync.md). What a set's
    reconciliation says it cannot see (`Reconciliation.blind`) may differ, only for keys
    drift changed since change number `since` (the run's start):
    any of them in a set without `updated_at`; in one whose `updated_at` is a date, one
    written again on the same day; where the run declared its day's window too large for
    one answer (`blind`, per set its `reconcile_blind`: `Blind.DAY_PAIRS`), what that
    declares (`excuse_pairs`)."""
    source = truth(target.server)
    moved = drifted(target.server, since)
    rewritten = drifted(target.server, since, rewrites=True)
    found = Comparison()
    for entity in ALL_ENTITIES:
        mode = modes.get(entity.name, "skip")
        if mode == "skip":
            continue
        want, have = canonical(entity, source[entity.name]), live(target, entity)
        found.compared += len(want)
        allowed = rewritten[entity.name] if entity.sees_updates else moved[entity.name]
        if entity is DOCUMENTS:  # and those of a patient drift changed while it was read
            patients = moved[PATIENTS.name]
            allowed = allowed | {
                str(d["id"]) for d in source[entity.name] if str(d["patient_id"]) in patients
            }
            allowed |= {
                str(k)
                for k, row in live(target, entity).items()
                if str(row["patient_id"]) in patients
            }
        wrong = {
            "missing": want.keys() - have.keys(),
            "extra": have.keys() - want.keys(),
            "stale": set()
            if mode == "incremental" and entity.strategy is Strategy.CREATED
            else {k for k in want.keys() & have.keys() if want[k] != have[k]},
        }
        if Blind.DAY_PAIRS.value in (blind or {}).get(entity.name, ""):
            excuse_pairs(wrong, moved[entity.name], target.server.config.drift_deletes)
        for kind, keys in wrong.items():
            found.add(entity, kind, sorted((k for k in keys if str(k) not in allowed), key=str))
        found.add(entity, "duplicated", ["*"] * duplicates(target, entity))
    assert_matches(found, ledger)


def excuse_pairs(wrong: dict[str, set], changed: set[str], gap: int) -> None:
    """What `Blind.DAY_PAIRS` declares, taken out of `wrong`: keys inserted during the run
    missing, each with a key deleted during the run still held (they cancel in every
    count), and up to `gap` more such deletes alone (what one drift deletes, between the
    last look's two requests)."""
    inserted = sorted((k for k in wrong["missing"] if str(k) in changed), key=str)
    deleted = sorted((k for k in wrong["extra"] if str(k) in changed), key=str)
    paired = min(len(inserted), len(deleted))
    wrong["missing"] -= set(inserted[:paired])
    wrong["extra"] -= set(deleted[: paired + gap])


def assert_reconciled(target: Target) -> None:
    """The last run's reconciliation left no difference it could not place."""
    ((left,),) = target.query(
        'SELECT "unreconciled" FROM "ops"."sync_runs" ORDER BY "started_at" DESC LIMIT 1'
    )
    assert left == 0


def record_run(ledger: Ledger, report, changes: int) -> None:
    ledger.changes_during_runs += changes
    ledger.reconciled += sum(int(f.get("reconciled", 0)) for f in report.entities.values())


def modes_of(report) -> dict[str, str]:
    return {name: str(figures["mode"]) for name, figures in report.entities.items()}


def blind_of(report) -> dict[str, str]:
    """Per set, what its reconciliation declared it cannot see (`reconcile_blind`)."""
    return {name: str(f.get("reconcile_blind", "")) for name, f in report.entities.items()}


def summary_modes(stdout: str) -> dict[str, str]:
    """Per entity set, its mode, from the `clinical-sync sync` summary table's rows."""
    names = {e.name for e in ALL_ENTITIES}
    rows = [line.split() for line in stdout.splitlines()]
    return {row[0]: row[1] for row in rows if row[:1] and row[0] in names}
