"""A rebuild from the lake produces the history the nightly runs produced, row for row, when
two runs' loads committed out of extraction order (issue 42): a scheduled run (the
deployment's) extracted a family, was held up, and loaded it after a command-line run that
extracted the same sets later had committed them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors.sandbox.server import SandboxServer
from sync.phase import PHASE_FILE, Phase
from tests.reliability.conftest import SYNC_TIMEOUT, sandbox_config
from tests.reliability.test_crashes import phase_target
from tests.warehouse_records import contents
from warehouse.load import Warehouse
from warehouse.publish import working_path
from warehouse.rebuild import rebuild

pytestmark = pytest.mark.reliability

# A run as the deployment's daemon starts it: the definitions its code location loads, the
# nightly job executed in one process (as the tenants' schedule runs it), no clinical-sync
# process around it to hold the warehouse for the whole run.
SCHEDULED = """
from dagster import DagsterInstance
from pipelines.definitions import defs
with DagsterInstance.ephemeral() as instance:
    result = defs.resolve_job_def("nightly_sync").execute_in_process(instance=instance)
print(result.run_id, result.success, flush=True)
"""


def test_a_rebuild_gives_the_history_the_nightly_runs_gave(tmp_path):
    # Each request slowed, so that the scheduled run is still reading its first family when
    # it is held up (SIGSTOP: it holds no lock then, and its own rate-limit file).
    with SandboxServer(sandbox_config(seed=57, scale=0.05, latency=0.03)) as server:
        target = phase_target(server, tmp_path / "target")
        control = server.control()
        target.sync("--full")
        control.advance(seconds=86400, update_fraction=0.3)  # what the scheduled run reads
        marker = Path(target.env()[PHASE_FILE])
        marker.unlink(missing_ok=True)
        env = {**target.env(), "CLINICAL_LIMITER_PATH": str(tmp_path / "scheduled.sqlite")}
        scheduled = subprocess.Popen(
            [sys.executable, "-c", SCHEDULED],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            deadline = time.monotonic() + SYNC_TIMEOUT
            while not (marker.exists() and marker.read_text().startswith(Phase.LAKE)):
                assert scheduled.poll() is None, "the scheduled run ended before it wrote a batch"
                assert time.monotonic() < deadline, "the scheduled run never wrote a batch"
                time.sleep(0.002)
            scheduled.send_signal(signal.SIGSTOP)  # held up in its first family's read
            control.advance(seconds=3600, update_fraction=0.3)  # changed again, then read
            later = target.sync()  # the command-line run: extracts after it, commits first
        finally:
            scheduled.send_signal(signal.SIGCONT)
        out, _ = scheduled.communicate(timeout=SYNC_TIMEOUT)
        scheduled_run, succeeded = out.split()[-2:]
        assert succeeded == "True", out
        assert later.returncode == 0

        work = working_path(target.warehouse)
        with Warehouse(work, read_only=True) as wh:  # its first family's loads came last
            (late,) = wh.con.execute(
                'SELECT count(*) FROM "ops"."loaded_batches" AS a, "ops"."loaded_batches" AS b '
                "WHERE a.run_id = ? AND b.run_id <> a.run_id AND a.entity = b.entity "
                "AND a.extracted_at < b.extracted_at AND a.loaded_at > b.loaded_at",
                [scheduled_run],
            ).fetchone()
        assert late > 0, "the scheduled run's loads did not commit after the later run's"

        nightly = contents(work)
        copy = tmp_path / "rebuilt.duckdb"
        rebuild(target.lake, copy)
        replayed = contents(copy)
        for name, rows in nightly.items():
            if name.startswith(("history.", "clinical.")):
                only_nightly = sorted(set(rows) - set(replayed[name]))
                only_rebuilt = sorted(set(replayed[name]) - set(rows))
                differ = [f"nightly {r}" for r in only_nightly[:3]]
                differ += [f"rebuilt {r}" for r in only_rebuilt[:3]]
                assert replayed[name] == rows, f"{name}:\n" + "\n".join(differ)
