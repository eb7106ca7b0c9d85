"""`clinical-sync` as an operator runs it: a real subprocess against a sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance

from connectors.clinical_records.catalogue import ALL_ENTITIES, ENTITY_SETS
from connectors.sandbox.server import SandboxServer
from tests.warehouse_records import contents
from warehouse.publish import working_path

CLI = str(Path(sys.executable).with_name("clinical-sync"))


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240
    )


def env_for(server: SandboxServer, tmp_path: Path) -> dict[str, str]:
    """What an operator sets: the sandbox's settings, a fast limit, files under tmp_path."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLINICAL_")},
        **server.env(),
        "CLINICAL_RATE_LIMIT": "1000",
        "CLINICAL_BURST": "200",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        "WAREHOUSE_PATH": str(tmp_path / "wh.duckdb"),
        "LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }


@pytest.fixture
def operator_env(sandbox, tmp_path) -> dict[str, str]:
    return env_for(sandbox, tmp_path)


@pytest.mark.integration
def test_sync_then_status(sandbox, operator_env, tmp_path):
    done = run(["sync"], operator_env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for ent in ENTITY_SETS:
        assert ent.name in done.stdout
    assert "requests" in done.stdout and "checks:" in done.stdout
    secret = operator_env["CLINICAL_CLIENT_SECRET"]
    assert secret not in done.stdout + done.stderr
    assert (tmp_path / "dagster" / "dagster.yaml").exists()

    counts = sandbox.store.counts()
    with duckdb.connect(operator_env["WAREHOUSE_PATH"], read_only=True) as con:
        for ent in ENTITY_SETS:
            (rows,) = con.execute(f'SELECT count(*) FROM "clinical"."{ent.table}"').fetchone()
            assert rows <= counts[ent.name] and rows >= counts[ent.name] * 0.95, ent.name

        run_id, entities, started = con.execute(
            'SELECT "run_id", "entities", epoch("started_at") FROM "ops"."sync_runs"'
        ).fetchone()
    assert sorted(entities) == sorted(
        e.name for e in ALL_ENTITIES
    )  # one row for the run, documents too
    with DagsterInstance.from_config(operator_env["DAGSTER_HOME"]) as instance:
        record = instance.get_run_record_by_id(run_id)
    assert abs(started - record.start_time) < 0.01  # the run's start, not its first load's

    status = run(["status"], operator_env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert "Claims" in status.stdout and "watermark" in status.stdout

    wrong = {**operator_env, "CLINICAL_CLIENT_SECRET": "not-the-secret-7f3a"}
    failed = run(["sync"], wrong, tmp_path)
    assert failed.returncode == 1
    assert_one_screen(failed, "invalid_client", "CLINICAL_CLIENT_SECRET")
    assert "not-the-secret-7f3a" not in failed.stdout + failed.stderr
    # A failed run publishes nothing: its mark waits in the working copy for the next run.
    working = working_path(operator_env["WAREHOUSE_PATH"])
    with duckdb.connect(str(working), read_only=True) as con:
        runs = con.execute(
            'SELECT "status", "message" FROM "ops"."sync_runs" ORDER BY "started_at"'
        ).fetchall()
    assert [status for status, _ in runs] == ["success", "failed"]
    assert "invalid_client" in runs[-1][1] and "not-the-secret-7f3a" not in runs[-1][1]


MAX_LINES = 25


def assert_one_screen(done: subprocess.CompletedProcess, *words: str) -> Path:
    """A failure fits a screen, names what it is about, and points at its full trace."""
    output = done.stdout + done.stderr
    assert len(output.splitlines()) <= MAX_LINES, output
    assert "Traceback" not in output and "Stack Trace" not in output, output
    for word in words:
        assert word in output, output
    assert "checks:" not in output  # no summary of checks that never ran
    log = Path(done.stderr.split("log:")[1].split()[0])
    assert "Stack Trace" in log.read_text(encoding="utf-8")
    return log


@pytest.mark.integration
def test_an_unreachable_service_fails_fast_naming_host_and_port(operator_env, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **operator_env,
        "CLINICAL_API_BASE_URL": f"http://127.0.0.1:{port}/api",
        "CLINICAL_AUTH_URL": f"http://127.0.0.1:{port}/auth",
    }
    # Fast against what the command costs anyway on this machine now (its imports, Dagster's
    # start): a refusal before any run, timed the same way, is the baseline. A retried
    # connection would add its backoffs (more than a minute) to it.
    started = time.monotonic()
    refused = run(["sync", "--only", "NoSuchSet"], env, tmp_path)
    baseline = time.monotonic() - started
    assert refused.returncode == 2
    started = time.monotonic()
    done = run(["sync"], env, tmp_path)
    assert done.returncode == 1
    assert_one_screen(done, f"127.0.0.1:{port}", "connection refused")
    assert time.monotonic() - started < 2 * baseline + 20

    verbose = run(["sync", "--only", "Branches", "--verbose"], env, tmp_path)
    assert verbose.returncode == 1 and "Stack Trace" in verbose.stderr


@pytest.mark.integration
def test_an_empty_environment_names_every_missing_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))}
    done = run(["sync"], env, tmp_path)
    assert done.returncode == 2
    output = done.stdout + done.stderr
    assert len(output.splitlines()) <= MAX_LINES and "Traceback" not in output
    for name in (
        "CLINICAL_API_BASE_URL",
        "CLINICAL_AUTH_URL",
        "CLINICAL_CLIENT_ID",
        "CLINICAL_CLIENT_SECRET",
        "CLINICAL_API_KEY",
        "CLINICAL_CUSTOMER",
    ):
        assert name in done.stderr


@pytest.mark.integration
def test_config_errors_name_the_variable_and_exit_2(operator_env, tmp_path):
    env = {k: v for k, v in operator_env.items() if k != "CLINICAL_CLIENT_SECRET"}
    done = run(["sync"], env, tmp_path)
    assert done.returncode == 2
    assert "CLINICAL_CLIENT_SECRET" in done.stderr
    assert "Traceback" not in done.stderr

    unknown = run(["sync", "--only", "Nope"], operator_env, tmp_path)
    assert unknown.returncode == 2 and "--only" in unknown.stderr


@pytest.mark.integration
def test_a_dbt_project_that_is_not_one_is_a_configuration_error_before_anything_runs(
    operator_env, tmp_path
):
    (tmp_path / "not-a-project").mkdir()
    for value in (tmp_path / "missing", tmp_path / "not-a-project"):
        env = {**operator_env, "CLINICAL_DBT_PROJECT": str(value)}
        done = run(["sync"], env, tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "CLINICAL_DBT_PROJECT: expected the folder of a dbt project" in done.stderr
        assert "Traceback" not in done.stderr
        assert not Path(operator_env["WAREHOUSE_PATH"]).exists()  # nothing ran
        assert not (tmp_path / "lake").exists()


@pytest.mark.integration
def test_rebuild_recreates_a_lost_warehouse_from_the_lake_without_the_api(fresh_sandbox, tmp_path):
    env = env_for(fresh_sandbox, tmp_path)
    synced = run(["sync"], env, tmp_path)
    assert synced.returncode == 0, synced.stderr[-3000:]
    warehouse = Path(env["WAREHOUSE_PATH"])
    original = contents(warehouse)
    assert sum(len(rows) for name, rows in original.items() if name.startswith("clinical.")) > 0
    warehouse.unlink()
    requests = fresh_sandbox.stats()["requests"]

    # No CLINICAL_* at all: the API could not be reached even if rebuild tried.
    offline = {k: v for k, v in env.items() if not k.startswith("CLINICAL_")}
    done = run(["rebuild"], offline, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert fresh_sandbox.stats()["requests"] == requests
    assert contents(warehouse) == original
    for ent in ENTITY_SETS:
        assert ent.name in done.stdout


@pytest.mark.integration
def test_each_warehouse_keeps_its_own_run_history(sandbox, operator_env, tmp_path):
    env = {k: v for k, v in operator_env.items() if k != "DAGSTER_HOME"}
    run_ids = {}
    for name in ("first", "second"):
        warehouse = tmp_path / name / "warehouse.duckdb"
        one = {**env, "WAREHOUSE_PATH": str(warehouse), "LAKE_ROOT": str(tmp_path / name / "lake")}
        done = run(["sync", "--only", "Branches"], one, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        run_ids[name] = done.stdout.split("run ")[-1].split(":")[0]

    for name, run_id in run_ids.items():
        home = tmp_path / name / "warehouse.dagster"
        with DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_runs()
            assert [r.run_id for r in runs] == [run_id], name
            assert runs[0].job_name == "nightly_sync"  # on the job's page in the UI
    assert not (tmp_path / "data").exists()


@pytest.mark.integration
def test_status_after_the_demo_lists_the_demos_tables(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))}
    env.pop("WAREHOUSE_PATH", None)
    demo = run(["demo", "--scale", "0.05", "--rate", "1000", "--burst", "200"], env, tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "a query to try" in demo.stdout and "analytics." in demo.stdout
    status = run(["status"], env, tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "data/demo/warehouse.duckdb" in status.stdout
    demo_rows = _rows_by_entity(demo.stdout)
    assert _rows_by_entity(status.stdout) == demo_rows and len(demo_rows) == len(ENTITY_SETS)


def _rows_by_entity(output: str) -> dict[str, tuple[str, str]]:
    """(rows, deleted) per entity set, from the status table as both commands print it."""
    names = {e.name for e in ENTITY_SETS}
    found = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 3 and cells[0] in names and cells[1][0].isdigit():
            found[cells[0]] = (cells[1], cells[2])
    return found
