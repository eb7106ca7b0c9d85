"""`clinical-sync tenants` and the tenants' `sync` and `status`, as an operator runs them: real
subprocesses against one sandbox serving three customers."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.tenants import sandbox_tenants
from connectors.sandbox.server import SandboxServer
from tests.sandboxes import serving
from tests.test_pipelines_cli import run

pytestmark = pytest.mark.integration

NAMES = ("clinic-a", "clinic-b", "clinic-c")


@pytest.fixture(scope="module")
def three() -> Iterator[SandboxServer]:
    with serving(NAMES, scale=0.02) as server:
        yield server


def operator(tmp_path: Path, tenants_file: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))}
    env["CLINICAL_LIMITER_PATH"] = str(tmp_path / "ratelimit.sqlite")
    if tenants_file is not None:
        env["CLINICAL_TENANTS_FILE"] = str(tenants_file)
    return env


@pytest.fixture
def broken(three, tmp_path) -> Path:
    """clinic-a as the sandbox made it; clinic-b with a wrong secret; clinic-c's API key in a
    variable nobody set."""
    path = tmp_path / "tenants.toml"
    sandbox_tenants(three, path)
    (tmp_path / "tenants.secrets" / "clinic-b.client_secret").write_text("not-the-secret\n")
    text = path.read_text()
    c_key = f'{{ file = "{tmp_path}/tenants.secrets/clinic-c.api_key" }}'
    path.write_text(text.replace(c_key, '{ env = "CLINIC_C_API_KEY" }'))
    return path


def test_a_tenants_file_needs_a_tenant_named(three, tmp_path):
    path = tmp_path / "tenants.toml"
    sandbox_tenants(three, path)
    done = run(["sync"], operator(tmp_path, path), tmp_path)
    assert done.returncode == 2
    assert "--tenant: expected a tenant's name, or --all-tenants" in done.stderr
    done = run(["sync", "--tenant", "clinic-z"], operator(tmp_path, path), tmp_path)
    assert done.returncode == 2 and "no tenant 'clinic-z'" in done.stderr
    done = run(["sync", "--tenant", "clinic-a"], operator(tmp_path, None), tmp_path)
    assert done.returncode == 2 and "CLINICAL_TENANTS_FILE" in done.stderr
    done = run(["sync", "--parallel", "2"], operator(tmp_path, path), tmp_path)
    assert done.returncode == 2 and "--parallel applies to --all-tenants" in done.stderr


def test_a_broken_file_is_one_line_per_problem(tmp_path):
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[[tenant]]\nname = "a"\nbase_url = "ftp://x"\n\n[[tenant]]\nname = "a"\nrate = "x"\n'
    )
    done = run(["tenants", "list"], operator(tmp_path, path), tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "clinical-sync: 6 settings are missing or wrong:"
    assert "  tenant 'a': named twice (tenants 1 and 2)" in lines
    assert any(
        line.startswith("  tenant 'a': base_url: expected an https:// URL") for line in lines
    )
    assert lines[-1].startswith(f"  do:   correct {path}")


def test_check_names_each_tenants_problem_on_its_line(three, broken, tmp_path):
    done = run(["tenants", "check"], operator(tmp_path, broken), tmp_path)
    assert done.returncode == 2, done.stderr
    lines = {
        line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("clinic")
    }
    assert "ok" in lines["clinic-a"].split()[1] and "svc-customer-api/clinic-a" in lines["clinic-a"]
    assert "FAILED" in lines["clinic-b"] and "invalid_client" in lines["clinic-b"]
    assert "FAILED" in lines["clinic-c"]
    assert "api_key: environment variable CLINIC_C_API_KEY is not set" in lines["clinic-c"]
    assert "1 of 3 tenants ready" in done.stdout
    assert three.env("clinic-a")["CLINICAL_CLIENT_SECRET"] not in done.stdout + done.stderr


def test_all_tenants_run_side_by_side_and_exit_with_the_worst(three, broken, tmp_path):
    env = operator(tmp_path, broken)
    done = run(["sync", "--all-tenants", "--parallel", "2"], env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr  # clinic-c: configuration
    assert "3 tenants, 2 at a time" in done.stdout  # the third starts when one has ended
    rows = {
        line.split()[0]: line.split()
        for line in done.stdout.splitlines()
        if line.startswith("clinic")
    }
    assert rows["clinic-a"][1:3] == ["0", "ok"]
    assert rows["clinic-b"][1:3] == ["1", "failed"]
    assert rows["clinic-c"][1:3] == ["2", "configuration"]
    assert "exit status 2: configuration (the worst of 3 tenants)" in done.stdout
    assert "invalid_client" in done.stdout  # clinic-b's own lines, under the table
    assert (tmp_path / "data" / "clinic-a" / "warehouse.duckdb").exists()
    assert not (tmp_path / "data" / "clinic-b" / "warehouse.duckdb").exists()

    status = run(["status", "--tenant", "clinic-a"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert "tenant clinic-a" in status.stdout and "Claims" in status.stdout
    listed = run(["tenants", "list"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {
        line.split()[0]: line for line in listed.stdout.splitlines() if line.startswith("clinic")
    }
    assert "success" in rows["clinic-a"] and "failure" in rows["clinic-b"]
    assert "no partition yet" not in rows["clinic-c"]  # --all-tenants kept them in step
    each_own_output_and_request_lines_in_its_log_file(tmp_path / "tenants.dagster")


def each_own_output_and_request_lines_in_its_log_file(home: Path) -> None:
    """Each tenant's process wrote its own private output; a run's line per request is in
    its log file, not among the run's Dagster events (each a row in the instance)."""
    from dagster import DagsterInstance

    (folder,) = (home / "logs").glob("sync-all-tenants-*")
    outputs = {p.stem: p for p in folder.glob("*.out")}
    assert sorted(outputs) == list(NAMES)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in outputs.values())
    a_run = outputs["clinic-a"].read_text().splitlines()[-1].split()[1].rstrip(":")
    assert "invalid_client" in outputs["clinic-b"].read_text()
    # in the words of its tenants file: its keys, not the variables it does not read
    b_lines = outputs["clinic-b"].read_text()
    assert "wrong client_id or client_secret" in b_lines and "CLINICAL_" not in b_lines
    assert "correct tenant clinic-b's client_id and client_secret" in b_lines
    # out of step: clinic-b, second in the file, starts its reads one family on (its first
    # request, the token's, failed there)
    assert "failed in extract_branches" in outputs["clinic-b"].read_text()
    assert a_run not in outputs["clinic-b"].read_text() + outputs["clinic-c"].read_text()
    (log,) = (home / "logs").glob("sync-clinic-a-*.log")
    text = log.read_text()
    assert "GET Patients status=200" in text
    # a run that succeeded: one line of figures, its events left in the instance
    assert f"--- run {a_run} succeeded:" in text and "Dagster events of run" not in text
    with DagsterInstance.local_temp(str(home)) as instance:
        messages = [record.message for record in instance.all_logs(a_run)]
    assert messages and not any("status=200" in m for m in messages)


def test_a_tenant_whose_service_is_down_is_told_what_to_check_in_its_file(tmp_path):
    """A tenant's run reads its tenants file, not CLINICAL_AUTH_URL or CLINICAL_API_BASE_URL:
    the failure names the tenant, the file and the keys to check there."""
    import socket

    from pipelines.tenants import Secret, write

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = write(
        tmp_path / "tenants.toml",
        [
            {
                "name": "clinic-x",
                "base_url": f"http://127.0.0.1:{port}/api",
                "auth_url": f"http://127.0.0.1:{port}/auth",
                "client_id": "clinic-x-client",
                "client_secret": Secret(env="CLINIC_X_SECRET"),
                "api_key": Secret(env="CLINIC_X_KEY"),
            }
        ],
    ).path
    env = {**operator(tmp_path, path), "CLINIC_X_SECRET": "s", "CLINIC_X_KEY": "k"}
    done = run(["sync", "--tenant", "clinic-x"], env, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "connection refused" in done.stderr
    advice = f"do:   check tenant clinic-x's auth_url and base_url in {path} and that its"
    assert advice in done.stderr, done.stderr
    assert "CLINICAL_" not in done.stderr, done.stderr


def test_add_writes_a_private_file_with_no_secret_in_it(three, tmp_path):
    path = tmp_path / "conf" / "tenants.toml"
    secret = tmp_path / "north.secret"
    secret.write_text(three.env("clinic-a")["CLINICAL_CLIENT_SECRET"])
    env = {**operator(tmp_path, path), "NORTH_KEY": three.env("clinic-a")["CLINICAL_API_KEY"]}
    args = ["tenants", "add", "north", "--customer", "clinic-a"]
    args += ["--base-url", three.base_url, "--auth-url", three.auth_url]
    args += ["--client-id", "clinic-a-client", "--client-secret-file", str(secret)]
    args += ["--api-key-env", "NORTH_KEY", "--rate", "1000", "--burst", "200"]
    done = run(args, env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert env["NORTH_KEY"] not in text and secret.read_text() not in text
    assert 'api_key = { env = "NORTH_KEY" }' in text
    again = run(args, env, tmp_path)
    assert again.returncode == 2 and "tenant 'north': named twice" in again.stderr
    assert path.read_text() == text  # refused: the file is unchanged
    checked = run(["tenants", "check"], env, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = run(["tenants", "list"], env, tmp_path)
    assert "north" in listed.stdout and "no partition yet" not in listed.stdout
