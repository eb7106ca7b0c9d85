"""Case 6: a source that moves while it is read, under faults and 3 s tokens: a full sync, a
day of changes and a nightly sync, then a sync killed mid-run and resumed. After each run
the warehouse equals the source as it stands at the end of the run.

Drift here is the worst the spec allows (4.2: records may shift between pages): every few
collection requests the set being read loses a record, gains one whose key sorts before,
between or after the keys already read, and has one updated (its `updated_at` moves where
it has one). Sets with `updated_at` must end exact. A set without it cannot see an update
of a record it has already read, nor an insert and a delete that cancel in one key range
(sync/reconcile.py): there, and only there, a difference is allowed, and only for a
key that drift changed during the run.
"""

from __future__ import annotations

import signal
import time

import pytest

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DOCUMENTS,
    PATIENTS,
    Strategy,
)
from connectors.sandbox.server import SandboxServer
from tests.reliability.conftest import (
    BASE_SCALE,
    SIZE,
    Ledger,
    Target,
    assert_lake_sound,
    canonical,
    duplicates,
    live,
    sandbox_config,
    truth,
)
from tests.reliability.test_crashes import writing_parquet

pytestmark = pytest.mark.reliability

FAULTS = {
    "error_rate": 0.05,
    "drop_rate": 0.01,
    "throttle_rate": 0.03,
    "retry_after_fraction": 0.5,
    "token_lifetime": 3,
}
# Every 10 requests at CI size. Under `make soak` a set's read is 10x longer: every 33, it
# meets about three times the changes it meets at CI size. Every 10 there, Appointments'
# deletes behind the read arrive faster than halving key ranges finds them (README).
DRIFT = {
    "drift_every": max(10, 10 * SIZE // 3),
    "drift_inserts": 1,
    "drift_updates": 1,
    "drift_deletes": 1,
}


def drifted(server: SandboxServer, since: int) -> dict[str, set[str]]:
    """Per set, the keys (as text) drift changed since change number `since`."""
    keys: dict[str, set[str]] = {e.name: set() for e in ALL_ENTITIES}
    for change in server.control().changes()[since:]:
        keys[change["entity"]].add(str(change["key"]))
    return keys


def assert_equal_to_source(
    target: Target,
    ledger: Ledger,
    *,
    moved: dict[str, set[str]],
    modes: dict[str, str],
) -> None:
    """Live rows equal the source now: no key missing, extra or held twice, no value stale.
    A set the run skipped is not compared; a set read by `created_at` increments is
    compared by key (an update waits for its snapshot: README, "How a sync spends its
    requests")."""
    source = truth(target.server)
    problems = []
    for entity in ALL_ENTITIES:
        mode = modes.get(entity.name, "skip")
        if mode == "skip":
            continue
        want, have = canonical(entity, source[entity.name]), live(target, entity)
        ledger.records_compared += len(want)
        allowed = set() if entity.sees_updates else moved[entity.name]
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
        for kind, keys in wrong.items():
            unexplained = sorted((k for k in keys if str(k) not in allowed), key=str)
            if unexplained:
                problems.append(f"{entity.name}: {len(unexplained)} {kind}: {unexplained[:3]}")
        if duplicates(target, entity):
            problems.append(f"{entity.name}: {duplicates(target, entity)} keys held twice")
    ledger.mismatches += len(problems)
    assert not problems, "warehouse differs from the source:\n" + "\n".join(problems)


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


def test_every_run_ends_equal_to_a_drifting_source(tmp_path, ledger):
    config = sandbox_config(seed=53, scale=BASE_SCALE * 2.5, fault_seed=9, **FAULTS, **DRIFT)
    with SandboxServer(config) as server:
        target = Target(server, tmp_path / "target")
        control = server.control()

        # 1. A full sync while every set drifts.
        mark = len(control.changes())
        report = target.sync_in_process(full=True)
        moved = drifted(server, mark)
        assert sum(map(len, moved.values())) >= 6, "drift must have hit the run"
        record_run(ledger, report, len(control.changes()) - mark)
        assert_equal_to_source(target, ledger, moved=moved, modes=modes_of(report))
        reconciled = {
            name: figures
            for name, figures in report.entities.items()
            if figures.get("reconcile_caught_up") or figures.get("reconcile_deleted")
        }
        assert reconciled, "drift during paging must have been reconciled somewhere"
        assert all(f["reconcile_residual"] == 0 for f in report.entities.values())
        assert all(c.passed for c in report.checks if c.name == "reconciled_with_source")
        ((found, spent, left),) = target.query(
            'SELECT "reconciled", "reconcile_requests", "unreconciled" FROM "ops"."sync_runs" '
            'WHERE "run_id" = ?',
            [report.run_id],
        )
        assert found > 0 and spent > 0 and left == 0

        # 2. A day of changes at the clinic, then the nightly sync, still drifting.
        control.advance(
            seconds=86400, insert_fraction=0.02, update_fraction=0.02, delete_fraction=0.01
        )
        mark = len(control.changes())
        report = target.sync_in_process()
        record_run(ledger, report, len(control.changes()) - mark)
        modes = modes_of(report)
        assert modes["Appointments"] == "incremental" and modes["Patients"] == "snapshot"
        assert_reconciled(target)
        assert_equal_to_source(target, ledger, moved=drifted(server, mark), modes=modes)
        # An increment finds hard deletes too (the day deleted 1%): soft deletes, not rows.
        ((soft_deleted,),) = target.query(
            'SELECT "soft_deleted" FROM "ops"."sync_runs" WHERE "run_id" = ?', [report.run_id]
        )
        assert soft_deleted > 0

        # 3. A sync killed while it writes its first batches, then a run to the end.
        mark = len(control.changes())
        process = target.start("sync", log=tmp_path / "killed.log")
        deadline = time.monotonic() + 60
        while process.poll() is None and not writing_parquet(target):
            assert time.monotonic() < deadline, "the killed sync never wrote a batch"
            time.sleep(0.002)
        time.sleep(0.2)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            ledger.crashes_survived += 1
        process.wait(timeout=30)
        done = target.sync()
        assert "sync failed" not in done.stderr
        resumed = {line.split()[0]: line.split()[1] for line in _summary(done.stdout)}
        assert_reconciled(target)
        assert_equal_to_source(target, ledger, moved=drifted(server, mark), modes=resumed)
        ledger.changes_during_runs += len(control.changes()) - mark
        ((found,),) = target.query(
            'SELECT "reconciled" FROM "ops"."sync_runs" ORDER BY "started_at" DESC LIMIT 1'
        )
        ledger.reconciled += int(found or 0)
        assert_lake_sound(target)
        ledger.add_faults(control.stats())


@pytest.mark.parametrize(
    "switch", [{"expand_cap": 3}, {"refuse_document_expand": True}], ids=["cap3", "refused"]
)
def test_a_capped_or_refused_expansion_stays_exact_while_the_source_drifts(
    switch, tmp_path, ledger
):
    """Nested collections cut at 3, or `$expand=Documents` refused (400): the full sync and
    the nightly after a day of changes still end equal to the drifting source (documents
    too), at more requests."""
    config = sandbox_config(seed=71, scale=BASE_SCALE, fault_seed=5, **FAULTS, **DRIFT, **switch)
    with SandboxServer(config) as server:
        target = Target(server, tmp_path / "target")
        control = server.control()
        for day in range(2):
            if day:
                control.advance(
                    seconds=86400,
                    insert_fraction=0.02,
                    update_fraction=0.02,
                    delete_fraction=0.01,
                    document_fraction=0.02,
                )
            mark = len(control.changes())
            report = target.sync_in_process(full=not day)
            record_run(ledger, report, len(control.changes()) - mark)
            assert_reconciled(target)
            assert_equal_to_source(
                target, ledger, moved=drifted(server, mark), modes=modes_of(report)
            )
            if "refuse_document_expand" in switch:  # listed per patient: one request each
                spent = int(float(report.entities["Documents"]["requests"]))
                assert spent >= len(truth(server)[PATIENTS.name]) * 0.9, spent
        ledger.add_faults(control.stats())


def _summary(stdout: str) -> list[str]:
    """The rows of the sync summary table: `<entity set> <mode> ...`."""
    names = {e.name for e in ALL_ENTITIES}
    return [line for line in stdout.splitlines() if line.split()[:1] and line.split()[0] in names]


def test_a_source_faster_than_the_budget_is_reported_not_hidden(tmp_path, ledger):
    """Drift on every request: reconciliation cannot converge. The run still loads what it
    read, says by how much each set may differ, and fails the reconciliation check."""
    config = sandbox_config(
        seed=59, scale=BASE_SCALE * 2.5, drift_every=1, drift_inserts=2, drift_deletes=2
    )
    with SandboxServer(config) as server:
        target = Target(server, tmp_path / "target")
        report = target.sync_in_process(full=True, only=["Appointments"])
        figures = report.entities["Appointments"]
        assert figures["reconcile_residual"] > 0
        assert figures["live_rows"] > 0.9 * len(truth(server)["Appointments"])
        failed = [c for c in report.checks if c.name == "reconciled_with_source"]
        assert failed and not failed[0].passed
        ((left,),) = target.query(
            'SELECT "unreconciled" FROM "ops"."sync_runs" WHERE "run_id" = ?', [report.run_id]
        )
        parts = ("reconcile_residual", "reconcile_stale", "reconcile_unconfirmed")
        assert left == sum(figures[name] for name in parts)
