"""Runs of `clinical-sync` that died without ending (SIGKILL, power loss) hold pool slots.

Dagster's daemon frees the slots of dead runs it launched; a CLI run executes in its own
process with no daemon watching, so each CLI run carries its host and process id as tags,
and the next CLI run marks such orphans failed and frees their slots before it starts.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

PID_TAG = "clinical-sync/pid"
HOST_TAG = "clinical-sync/host"


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


def release_orphans(instance: DagsterInstance) -> list[str]:
    """Fail the unfinished CLI runs of this host whose process is gone; free their slots."""
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
        instance.report_run_failed(run, "the clinical-sync process ended without finishing")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released
