"""Case 7: analysts and the sync never block each other; everything written is owner-only.

Readers are separate processes on the published WAREHOUSE_PATH, as a notebook or a BI tool
would be: one holds a read-only connection through two syncs, one opens a new connection
for every read, as `clinical-sync sql` does (`warehouse.connection.open_read_only`: an open
that meets the instant of a publication is tried again). Both read the claims count in a loop and write down what they saw.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from connectors.sandbox.server import SandboxServer
from sync.state import LOCK_WAIT_SECONDS
from tests.reliability.conftest import SYNC_TIMEOUT, Target, sandbox_config

pytestmark = pytest.mark.reliability

READER = """
import sys, time, duckdb
from warehouse.connection import open_read_only
path, log, stop, held = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "held"
SQL = "SELECT count(*) FROM clinical.claims"
con = duckdb.connect(path, read_only=True) if held else None
with open(log, "w") as out:
    while True:
        try:
            if held:
                (n,) = con.execute(SQL).fetchone()
            else:
                with open_read_only(path) as fresh:  # as clinical-sync sql opens it
                    (n,) = fresh.execute(SQL).fetchone()
            out.write(f"{n}\\n")
        except Exception as error:  # every failure is written down, none ends the loop
            out.write(f"error {type(error).__name__}: {error}\\n")
        out.flush()
        try:
            open(stop).close()
            break
        except FileNotFoundError:
            time.sleep(0.01)
"""


def start_reader(target: Target, kind: str, root: Path) -> tuple[subprocess.Popen, Path]:
    log = root / f"{kind}.log"
    args = [str(target.warehouse), str(log), str(root / "stop"), kind]
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(READER), *args])
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text()):  # reading before the syncs begin
        assert proc.poll() is None and time.monotonic() < deadline, "reader did not start"
        time.sleep(0.05)
    return proc, log


def claims(target: Target) -> int:
    """What a connection opened now sees (none is open in this process: DuckDB would hand
    back the same database it already holds)."""
    ((n,),) = target.query("SELECT count(*) FROM clinical.claims")
    return int(n)


def test_readers_never_block_a_sync_and_a_held_connection_keeps_its_night(tmp_path):
    with SandboxServer(sandbox_config(seed=67, latency=0.002)) as server:
        target = Target(server, tmp_path / "target")
        target.root.mkdir(parents=True)
        target.sync_in_process(full=True)  # the readers are the other processes here
        seen = [claims(target)]
        readers = [start_reader(target, kind, tmp_path) for kind in ("held", "fresh")]
        try:
            for full in (True, False):  # a full sync, then a nightly one
                server.control().advance(seconds=86400, insert_fraction=0.1, delete_fraction=0)
                started = time.monotonic()
                target.sync_in_process(full=full)  # raises unless it succeeded
                assert time.monotonic() - started < LOCK_WAIT_SECONDS  # it never waited on a lock
                seen.append(claims(target))
            # The fresh reader reads again before it stops: at 10x a read can take longer
            # than the moment between the last publication and the stop.
            fresh_log = readers[1][1]
            deadline = time.monotonic() + 30
            while str(seen[-1]) not in fresh_log.read_text().split("\n"):
                assert time.monotonic() < deadline, "the fresh reader never saw the last night"
                time.sleep(0.05)
        finally:
            (tmp_path / "stop").touch()
            for proc, _ in readers:
                proc.wait(timeout=30)
        assert seen[0] < seen[1] < seen[2], seen  # each run published the new state
        (held, held_log), (fresh, fresh_log) = readers
        assert held.returncode == fresh.returncode == 0
        held_counts = held_log.read_text().split("\n")[:-1]
        fresh_counts = fresh_log.read_text().split("\n")[:-1]
        assert not [c for c in held_counts + fresh_counts if c.startswith("error")]
        assert set(held_counts) == {str(seen[0])} and len(held_counts) > 10
        observed = [int(c) for c in fresh_counts]  # a whole night or the next, never half
        assert set(observed) <= set(seen) and observed == sorted(observed), set(observed)
        assert seen[2] in observed


def open_entries(*roots: Path) -> list[str]:
    """Files and folders under `roots` that the group or others may access."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode & 0o077 and not path.is_symlink():
                found.append(f"{oct(mode)} {path.relative_to(root)}")
    return found


def test_a_sync_under_umask_000_leaves_nothing_readable_by_others(tmp_path):
    with SandboxServer(sandbox_config(seed=71)) as server:
        target = Target(server, tmp_path / "target")
        target.extra_env["DAGSTER_HOME"] = str(target.root / "home" / "dagster")
        target.root.mkdir(parents=True)

        def sync_under_umask_000() -> subprocess.CompletedProcess:
            done = subprocess.run(
                target.command("sync", "--only", "Branches", "Claims", "Prescriptions"),
                env=target.env(),
                cwd=target.root,
                capture_output=True,
                text=True,
                timeout=SYNC_TIMEOUT,
                preexec_fn=lambda: os.umask(0),
            )
            assert done.returncode == 0, done.stderr
            return done

        sync_under_umask_000()
        assert target.warehouse.exists() and (target.root / "warehouse.work").is_dir()
        assert open_entries(target.root) == []  # warehouse folder: lake, home, limiter too

        # Files from before the rule (an old umask), tightened by the next run, which says so.
        for path in (target.warehouse, target.lake, *target.lake.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        logs = target.root / "home" / "dagster" / "logs"
        before = set(logs.glob("sync-*.log"))
        sync_under_umask_000()
        assert open_entries(target.root) == []
        # The run's log file (cli/log.py) says what it tightened.
        (log,) = set(logs.glob("sync-*.log")) - before
        said = log.read_text(encoding="utf-8")
        assert f"warehouse {target.warehouse}: 1 file or folder was open" in said
        assert f"lake {target.lake}: " in said
