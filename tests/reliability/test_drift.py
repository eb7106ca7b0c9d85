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

import random

import pytest

from connectors.clinical_records.catalogue import PATIENTS
from connectors.sandbox.server import SandboxServer
from sync.phase import Phase
from tests.reliability.conftest import (
    BASE_SCALE,
    SIZE,
    Target,
    assert_equal_to_source,
    assert_lake_sound,
    assert_reconciled,
    blind_of,
    drifted,
    modes_of,
    record_run,
    sandbox_config,
    truth,
)
from tests.reliability.test_crashes import count_kill, kill_in, phase_target, resume

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
# deletes behind the read arrive faster than halving key ranges finds them (docs/reliability.md).
DRIFT = {
    "drift_every": max(10, 10 * SIZE // 3),
    "drift_inserts": 1,
    "drift_updates": 1,
    "drift_deletes": 1,
}


def test_every_run_ends_equal_to_a_drifting_source(tmp_path, ledger):
    config = sandbox_config(seed=53, scale=BASE_SCALE * 2.5, fault_seed=9, **FAULTS, **DRIFT)
    with SandboxServer(config) as server:
        target = phase_target(server, tmp_path / "target")
        control = server.control()

        # 1. A full sync while every set drifts.
        mark = len(control.changes())
        report = target.sync_in_process(full=True)
        moved = drifted(server, mark)
        assert sum(map(len, moved.values())) >= 6, "drift must have hit the run"
        record_run(ledger, report, len(control.changes()) - mark)
        assert_equal_to_source(
            target, ledger, since=mark, modes=modes_of(report), blind=blind_of(report)
        )
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
        assert_equal_to_source(target, ledger, since=mark, modes=modes, blind=blind_of(report))
        # An increment finds hard deletes too (the day deleted 1%): soft deletes, not rows.
        ((soft_deleted,),) = target.query(
            'SELECT "soft_deleted" FROM "ops"."sync_runs" WHERE "run_id" = ?', [report.run_id]
        )
        assert soft_deleted > 0

        # 3. A sync killed while it writes its batches, then a run to the end.
        count_kill(ledger, kill_in(target, Phase.LAKE, random.Random(3), tmp_path / "k.log"))
        resume(target, ledger)
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
                target, ledger, since=mark, modes=modes_of(report), blind=blind_of(report)
            )
            if "refuse_document_expand" in switch:  # listed per patient: one request each
                spent = int(float(report.entities["Documents"]["requests"]))
                assert spent >= len(truth(server)[PATIENTS.name]) * 0.9, spent
        ledger.add_faults(control.stats())


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
