"""The Dagster instance on PostgreSQL (DAGSTER_POSTGRES_URL), against a real server: the
storage it selects, the run queue, migration by several processes at once, and what an
operator sees when the server cannot be used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dagster import asset

from pipelines import home
from pipelines.postgres import POSTGRES_VARIABLE
from pipelines.resources import WarehouseAccess
from tests.dev_server import free_port
from tests.postgres import PostgresServer

CLI = str(Path(sys.executable).with_name("clinical-sync"))


def test_the_url_selects_postgres_storage_and_wide_pools(postgres_url, tmp_path, monkeypatch):
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    monkeypatch.setenv(POSTGRES_VARIABLE, postgres_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    with home.instance() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 10
        assert config.run_queue_config.max_concurrent_runs == 10
        (limit,) = config.run_queue_config.tag_concurrency_limits
        assert limit == {
            "key": "dagster/partition",
            "value": {"applyLimitPerUniqueValue": True},
            "limit": 1,
        }
        assert not instance.telemetry_enabled
        limits = {pool.name: pool.limit for pool in instance.event_log_storage.get_pool_limits()}
        assert limits == {"clinical_api": 10, "warehouse": 10}  # written before any run
    written = (tmp_path / "home" / "dagster.yaml").read_text()
    assert f"env: {POSTGRES_VARIABLE}" in written
    postgres_password = postgres_url.split(":")[2].split("@")[0]
    assert postgres_password not in written  # the URL stays in the environment


def test_without_the_url_the_instance_stays_sqlite_as_on_one_machine(tmp_path, monkeypatch):
    from dagster._core.storage.runs import SqliteRunStorage

    monkeypatch.delenv(POSTGRES_VARIABLE, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    with home.instance() as instance:
        assert isinstance(instance.run_storage, SqliteRunStorage)
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    written = (tmp_path / "home" / "dagster.yaml").read_text()
    assert written == home.instance_settings(tmp_path / "home")
    assert written.startswith(home.INSTANCE_YAML.read_text())  # and this home's SQLite files


def test_processes_starting_at_once_on_a_new_database_all_get_the_instance(postgres_url, tmp_path):
    """Four processes, each with its own home, create the schema together: one at a time under
    the advisory lock, none fails on a table another just created."""
    script = (
        "from pipelines import home\n"
        "with home.instance() as i:\n"
        "    print(type(i.run_storage).__name__, i.get_runs_count())\n"
    )
    procs = []
    for n in range(4):
        env = {
            **os.environ,
            POSTGRES_VARIABLE: postgres_url,
            "DAGSTER_HOME": str(tmp_path / f"h{n}"),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert out.split() == ["PostgresRunStorage", "0"]


def _sync_with(url: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))},
        "CLINICAL_API_BASE_URL": "http://127.0.0.1:9/api",
        "CLINICAL_AUTH_URL": "http://127.0.0.1:9/auth",
        "CLINICAL_CLIENT_ID": "id",
        "CLINICAL_CLIENT_SECRET": "secret",
        "CLINICAL_API_KEY": "key",
        "CLINICAL_CUSTOMER": "acme",
        "WAREHOUSE_PATH": str(tmp_path / "data" / "warehouse.duckdb"),
        "LAKE_ROOT": str(tmp_path / "data" / "lake"),
        POSTGRES_VARIABLE: url,
    }
    return subprocess.run(
        [CLI, "sync"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_an_unreachable_server_is_one_line_naming_the_host_and_nothing_is_written(tmp_path):
    port = free_port()  # nothing listens there
    done = _sync_with(f"postgresql://clinical:pw-7f3a@127.0.0.1:{port}/dagster", tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"PostgreSQL at 127.0.0.1:{port}/dagster ({POSTGRES_VARIABLE})" in line
    assert "check that the server is running" in line
    assert "pw-7f3a" not in line and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # no Dagster home, warehouse or lake


def test_a_wrong_password_says_to_check_the_password(postgres: PostgresServer, tmp_path):
    wrong = postgres.url.replace(postgres.password, "not-the-password")
    done = _sync_with(wrong, tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"127.0.0.1:{postgres.port}" in line and "check the user and password" in line
    assert "not-the-password" not in line
    assert not (tmp_path / "data").exists()


def test_a_deployments_preparation_refreshes_a_chosen_homes_settings(tmp_path, monkeypatch):
    """`python -m pipelines.home` (refresh) writes this version's settings over a home the
    operator chose; the CLI's own preparation leaves an operator's file alone."""
    chosen = tmp_path / "home"
    chosen.mkdir()
    (chosen / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.delenv(POSTGRES_VARIABLE, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(chosen))
    home.prepare_instance().dispose()
    assert (chosen / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.home"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Dagster instance ready in {chosen}" in done.stdout
    assert (chosen / "dagster.yaml").read_text() == home.instance_settings(chosen)


def _sessions(url: str) -> int:
    """Connections the server has accepted to this database so far (PostgreSQL 14+)."""
    import psycopg2

    with psycopg2.connect(url) as con, con.cursor() as cur:
        cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cur.fetchone()[0]


def test_a_process_that_runs_keeps_its_connections(postgres_url, tmp_path, monkeypatch):
    """Dagster opens a PostgreSQL connection per statement unless told to hold them: a run
    materializing one asset and its check opened dozens; held, a handful (one per storage)."""
    from dagster import materialize

    from tests.test_pipelines_sqlite_storage import numbers, three_numbers

    monkeypatch.setenv(POSTGRES_VARIABLE, postgres_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    opened = {}
    for runs_here in (False, True):
        with home.instance(runs_here=runs_here) as instance:
            before = _sessions(postgres_url)
            assert materialize([numbers, three_numbers], instance=instance).success
            opened[runs_here] = _sessions(postgres_url) - before - 1  # less _sessions' own
    assert opened[False] >= 20 and opened[True] <= 6, opened


STEP_STARTS: list[int] = []  # the server's sessions when a step of ours began


@asset
def counted(warehouse: WarehouseAccess) -> int:
    """A step of ours: it requires the warehouse resource."""
    STEP_STARTS.append(_sessions(os.environ[POSTGRES_VARIABLE]))
    return 3


def test_a_run_dagster_launches_holds_them_once_a_step_of_ours_sets_up(
    postgres_url, tmp_path, monkeypatch
):
    """A run the daemon launched runs in a worker whose instance Dagster opens (NullPool):
    the warehouse resource, which every step of ours requires, holds its connections there
    from its setup on. Counted from the step's start to the run's end, against the same run
    with the hold turned off."""
    from dagster import materialize

    from pipelines import postgres
    from pipelines.resources import WarehouseResource

    monkeypatch.setenv(POSTGRES_VARIABLE, postgres_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    resources = {"warehouse": WarehouseResource(path=str(tmp_path / "w.duckdb"))}
    held = postgres.hold_connections
    opened = {}
    for holds in (False, True):
        monkeypatch.setattr(postgres, "hold_connections", held if holds else lambda _: None)
        with home.instance() as instance:  # as a run worker opens it: nothing held
            assert materialize([counted], instance=instance, resources=resources).success
            opened[holds] = _sessions(postgres_url) - STEP_STARTS.pop() - 1  # less its own
    assert opened[False] >= 10 and opened[True] <= 4, opened
