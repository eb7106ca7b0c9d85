"""Issue 42: the record of every run is true. A run killed (SIGKILL) while it loads is recorded
killed, not exact, by whoever finds it first (the next sync, `status`), in its own tenant's
warehouse and under its own tenant's name; the runs that finished read success and exact;
a run's start is Dagster's."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from cli.tenants import sandbox_tenants
from connectors.sandbox.server import SandboxServer
from sync.phase import Phase
from tests.reliability.conftest import Target, sandbox_config
from tests.reliability.test_crashes import kill_in, phase_target
from tests.sandboxes import serving
from tests.webhook_receiver import webhook_receiver
from warehouse.publish import working_path

pytestmark = pytest.mark.reliability

RUN_COLUMNS = '"run_id", "status", "exact", "message", "started_at", "finished_at"'


def runs(path: Path) -> dict[str, tuple]:
    """ops.sync_runs of the warehouse file at `path`, by run id."""
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute(f'SELECT {RUN_COLUMNS} FROM "ops"."sync_runs"').fetchall()
    return {row[0]: row[1:] for row in rows}


def killed_while_loading(target: Target, log: Path, *args: str) -> str:
    """`clinical-sync sync ARGS` SIGKILLed in its load phase, after a set committed; its run id."""
    rng = random.Random(4)
    for _ in range(3):
        at = kill_in(target, Phase.LOAD, rng, log, *args)
        if at:
            break
    assert at, "the sync ended before its loads"
    with DagsterInstance.from_config(str(target.dagster_home)) as instance:
        (run,) = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
        return run.run_id


def test_a_run_killed_while_it_loads_reads_killed_and_the_finished_ones_success(tmp_path):
    with SandboxServer(sandbox_config(seed=71, scale=0.1, latency=0.005)) as server:
        target = phase_target(server, tmp_path / "target")
        target.sync("--only", "Branches")  # a warehouse to find the killed run in
        killed = killed_while_loading(target, tmp_path / "killed.log")
        done = target.sync()
        assert "had died without finishing" in done.stderr, done.stderr
        recorded = runs(target.warehouse)  # published by the run that found it
        status, exact, message, started, finished = recorded[killed]
        assert (status, exact) == ("killed", False)
        assert "ended without finishing" in message
        with DagsterInstance.from_config(str(target.dagster_home)) as instance:
            start = instance.get_run_record_by_id(killed).start_time
        assert abs(started.timestamp() - start) < 0.01  # Dagster's run start
        assert finished >= started  # its last event
        finished_runs = {k: v for k, v in recorded.items() if k != killed}
        assert len(finished_runs) >= 2  # the first sync, the last (and any the kill missed)
        assert {(s, e) for s, e, *_ in finished_runs.values()} == {("success", True)}
        # The lake keeps each ending, so a rebuild keeps it even without the warehouse.
        kept = json.loads((target.lake / "_runs" / f"{killed}.json").read_text())
        assert kept["status"] == "killed" and kept["exact"] is False


def test_status_finds_a_killed_run_first(tmp_path):
    with SandboxServer(sandbox_config(seed=72, scale=0.1, latency=0.005)) as server:
        target = phase_target(server, tmp_path / "target")
        target.sync("--only", "Branches")
        killed = killed_while_loading(target, tmp_path / "killed.log")
        shown = target.run("status", "--json")
        assert shown.returncode == 0, shown.stderr
        json.loads(shown.stdout)  # stdout stays one JSON object
        assert f"run {killed[:8]} had died without finishing" in shown.stderr
        # A killed run publishes nothing: its row waits in the working copy for the next run.
        assert runs(working_path(target.warehouse))[killed][:2] == ("killed", False)
        again = target.run("status")
        assert "had died" not in again.stderr  # found once


def test_another_tenants_orphan_is_recorded_and_told_under_its_own_name(tmp_path):
    with serving(("clinic-a", "clinic-b"), scale=0.05) as server, webhook_receiver() as hook:
        tenants_file = tmp_path / "tenants.toml"
        found = sandbox_tenants(server, tenants_file)
        target = phase_target(
            server,
            tmp_path / "target",
            CLINICAL_TENANTS_FILE=str(tenants_file),
            CLINICAL_ALERT_WEBHOOK=hook.url,
        )
        target.sync("--tenant", "clinic-b", "--only", "Branches")
        killed = killed_while_loading(target, tmp_path / "killed.log", "--tenant", "clinic-b")
        hook.posts.clear()
        target.sync("--tenant", "clinic-a")

        b, a = found.get("clinic-b"), found.get("clinic-a")
        assert runs(working_path(b.warehouse))[killed][:2] == ("killed", False)
        assert killed not in runs(a.warehouse) and killed not in runs(working_path(a.warehouse))
        (told,) = [m for m in hook.messages() if m["clinical_sync"]["run_id"] == killed]
        assert told["clinical_sync"]["tenant"] == "clinic-b"
        assert str(b.warehouse) in told["text"] and "clinic-a" not in told["text"]
