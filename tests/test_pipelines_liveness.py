"""A CLI run killed mid-step must not hold its pool slot for ever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.storage.dagster_run import DagsterRun

from pipelines.keys import API_POOL
from pipelines.liveness import release_orphans, run_tags

ROOT = Path(__file__).resolve().parents[1]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_slots_of_dead_cli_runs_are_freed_and_live_ones_kept(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots(API_POOL, 2)
        dead = DagsterRun(
            job_name="sync",
            run_id="dead-run",
            status=DagsterRunStatus.STARTED,
            tags={**run_tags(), "clinical-sync/pid": str(dead_pid())},
        )
        live = DagsterRun(
            job_name="sync", run_id="live-run", status=DagsterRunStatus.STARTED, tags=run_tags()
        )
        foreign = DagsterRun(job_name="ui", run_id="ui-run", status=DagsterRunStatus.STARTED)
        for run in (dead, live, foreign):
            instance.add_run(run)
        for run in (dead, live):
            assert storage.claim_concurrency_slot(API_POOL, run.run_id, "step").is_claimed

        assert [orphan.run.run_id for orphan in release_orphans(instance)] == ["dead-run"]
        claimed = {s.run_id for s in storage.get_concurrency_info(API_POOL).claimed_slots}
        assert claimed == {"live-run"}
        assert instance.get_run_by_id("dead-run").status is DagsterRunStatus.FAILURE
        assert instance.get_run_by_id("ui-run").status is DagsterRunStatus.STARTED
