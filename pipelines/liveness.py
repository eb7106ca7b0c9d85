"""Runs of `clinical-sync` that died without ending (SIGKILL, power loss) hold pool slots.

Dagster's daemon frees the slots of dead runs it launched; a CLI run executes in its own
process with no daemon watching, so each CLI run carries its host and process id as tags,
and the next CLI run (or `status`) marks such orphans failed in Dagster and frees their slots
before it starts; `run_record.end_orphans` then records each as killed in its own warehouse.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

PID_TAG = "clinical-sync/pid"
HOST_TAG = "clinical-sync/host"


@dataclass(frozen=True)
class Orphan:
    """A run whose process died: the run, and when it was last heard of (its last event)."""

    run: DagsterRun
    last_seen: datetime | None


def run_started_at(instance: DagsterInstance, run_id: str) -> datetime | None:
    """When Dagster started the run (for ops.sync_runs.started_at); None if unknown."""
    record = instance.get_run_record_by_id(run_id)
    start = record.start_time if record is not None else None
    return datetime.fromtimestamp(start, UTC) if start is not None else None


def run_tags() -> dict[str, str]:
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _last_event(instance: DagsterInstance, run_id: str) -> datetime | None:
    found = instance.get_records_for_run(run_id, limit=1, ascending=False).records
    return datetime.fromtimestamp(found[0].timestamp, UTC) if found else None


def release_orphans(instance: DagsterInstance) -> list[Orphan]:
    """Fail the unfinished CLI runs of this host whose process is gone, whatever tenant each
    ran for (each run's tags say whose it was); free their slots."""
    host = socket.gethostname()
    released = []
    unfinished = RunsFilter(
        statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.NOT_STARTED]
    )
    for run in instance.get_runs(filters=unfinished):
        pid = run.tags.get(PID_TAG)
        if pid is None or run.tags.get(HOST_TAG) != host or not pid.isdigit():
            continue
        if _alive(int(pid)):
            continue
        last_seen = _last_event(instance, run.run_id)
        instance.report_run_failed(run, "the clinical-sync process ended without finishing")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(Orphan(run, last_seen))
    return released
