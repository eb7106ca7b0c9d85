"""After a crash: a sync killed with SIGKILL leaves its Dagster run STARTED and its pool slots
(`clinical_api`, `warehouse`) claimed, so every later run would wait for them forever.

`clinical-sync sync` tags its runs with the process id and host; before a new run, runs of
this host whose process is gone are marked failed and their slots freed. A run of a live
process (a concurrent sync) is left alone.
"""

from __future__ import annotations

import os
import socket

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

PID_TAG = "clinical-sync/pid"
HOST_TAG = "clinical-sync/host"
UNFINISHED = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def process_tags() -> dict[str, str]:
    """Tags naming the process that runs the sync, for `release_dead_runs` to check later."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def release_dead_runs(instance: DagsterInstance) -> list[str]:
    """Fail the unfinished runs whose process on this host is gone and free their slots."""
    host = socket.gethostname()
    released = []
    for run in instance.get_runs(RunsFilter(statuses=UNFINISHED, tags={HOST_TAG: host})):
        pid = run.tags.get(PID_TAG, "")
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        instance.report_run_failed(run, "the sync process died (killed or crashed)")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released
