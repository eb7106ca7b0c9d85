"""Many customers on several workers, as deployed: three tenants of one tenants file on a
sandbox serving three customers, the instance on PostgreSQL, the daemon, and two workers (code
servers with their own home and temporary folders, sharing only PostgreSQL and the data
volume), each starting the nightly runs of its share of the tenants.

The real daemon ticks the real nightly schedule (its cron every minute here, started through
the webserver as the UI's toggle does, stopped after its first tick): one run per tenant, on
its worker; each tenant's warehouse equals its own customer's data and nothing else; every
request the service saw for a customer carried that customer's credentials, as many as the
tenant's run counted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, RunsFilter

from cli.tenants import sandbox_tenants
from connectors.clinical_records.catalogue import ENTITY_SETS, PATIENTS
from pipelines.partitions import PARTITION_TAG, TENANT_DIMENSION
from tests.deployment import (
    REPOSITORY,
    base_env,
    code_server,
    daemon,
    graphql,
    instance_home,
    run_errors,
    wait_for_runs,
    webserver,
    workspace_file,
)
from tests.sandboxes import serving
from tests.truth import canonical, live_rows

NAMES = ["clinic-1", "clinic-2", "clinic-3"]
SHARES = {"w1": NAMES[:2], "w2": NAMES[2:]}
SCHEDULE = "nightly_sync_schedule"
TURN = """
mutation Turn($selector: ScheduleSelector!) {
  %s(scheduleSelector: $selector) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
    ... on PythonError { message }
  }
}"""
# The UI's toggle: on, and back to its status in code (stopped by default).
ON, OFF = "startSchedule", "resetSchedule"
TICK_WRITTEN_SECONDS = 15


def worker_env(worker: str, postgres_url: str, tenants_file: Path, folder: Path) -> dict:
    """A worker's environment: the instance, the tenants file on the shared volume, its share
    of the tenants, a cron that fires every minute; its own home, temp folder and limiter."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    return base_env(
        DAGSTER_POSTGRES_URL=postgres_url,
        DAGSTER_HOME=str(instance_home(folder / "dagster", postgres_url)),
        CLINICAL_TENANTS_FILE=str(tenants_file),
        CLINICAL_WORKER_TENANTS=",".join(SHARES[worker]),
        CLINICAL_NIGHTLY_CRON="* * * * *",
        CLINICAL_LIMITER_PATH=str(folder / "ratelimit.sqlite"),
        HOME=str(folder),
        TMPDIR=str(folder / "tmp"),
    )


def wait_until(ready, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s"
        time.sleep(1)


def turn(ui: str, worker: str, mutation: str) -> str:
    """Start or reset the nightly schedule of a worker's location; its status after."""
    selector = {
        "repositoryLocationName": worker,
        "repositoryName": REPOSITORY,
        "scheduleName": SCHEDULE,
    }
    done = graphql(ui, TURN % mutation, {"selector": selector})[mutation]
    assert done["__typename"] == "ScheduleStateResult", done
    return done["scheduleState"]["status"]


def requests_counted(instance: DagsterInstance, run_id: str) -> int:
    """The requests a run's loads report (each set's share of its extraction's requests)."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return sum(
        int(m.metadata["requests"].value)
        for m in (r.event_log_entry.asset_materialization for r in records)
        if m.asset_key.path[0] == "clinical" and "requests" in m.metadata
    )


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_the_nightly_schedule_runs_each_tenant_once_on_its_worker(postgres, tmp_path, monkeypatch):
    url = postgres.database()
    volume = tmp_path / "volume"  # what every worker mounts: tenants file, warehouses, lakes
    with serving(NAMES, scale=0.03, rate=20, burst=10) as sandbox:
        found = sandbox_tenants(sandbox, volume / "tenants.toml")
        envs = {w: worker_env(w, url, found.path, tmp_path / w) for w in SHARES}
        home = instance_home(tmp_path / "instance", url)
        monkeypatch.setenv("DAGSTER_POSTGRES_URL", url)
        with (
            code_server("w1", envs["w1"], tmp_path / "w1") as one,
            code_server("w2", envs["w2"], tmp_path / "w2") as two,
            DagsterInstance.from_config(str(home)) as instance,
        ):
            workspace = workspace_file(tmp_path / "workspace.yaml", [one, two])
            env = base_env(DAGSTER_POSTGRES_URL=url)
            with daemon(home, workspace, env), webserver(home, workspace, env) as ui:
                wait_until(  # the tenant_partitions sensor, ticked by the daemon
                    lambda: len(instance.get_dynamic_partitions(TENANT_DIMENSION)) == 3,
                    "the tenant partitions",
                )
                for worker in SHARES:
                    assert turn(ui, worker, ON) == "RUNNING"
                scheduled = RunsFilter(tags={"dagster/schedule_name": SCHEDULE})
                wait_until(lambda: len(instance.get_runs(scheduled)) >= 3, "the schedule's tick")
                # One tick: off before the next minute's, once the daemon has written this one's
                # end (a stop that lands while a tick is being written is overwritten by it).
                time.sleep(TICK_WRITTEN_SECONDS)
                for worker in SHARES:
                    assert turn(ui, worker, OFF) == "STOPPED"
                runs = instance.get_runs(scheduled)
                next_tick = 60 - time.time() % 60 + TICK_WRITTEN_SECONDS
                time.sleep(next_tick)
                assert len(instance.get_runs(scheduled)) == len(runs), "a second tick ran"
                ended = wait_for_runs(ui, [r.run_id for r in runs], timeout=1500)
                errors = [line for r in runs for line in run_errors(ui, r.run_id)]
            counted = {r.tags[PARTITION_TAG]: requests_counted(instance, r.run_id) for r in runs}
        seen = sandbox.sandbox.customer_requests()
        stats = sandbox.stats()
        truths = {name: sandbox.store_of(name).ground_truth() for name in NAMES}

    assert set(ended.values()) == {"SUCCESS"}, "\n".join(errors)[-4000:]
    assert sorted(r.tags[PARTITION_TAG] for r in runs) == NAMES
    for run in runs:  # each on the worker whose share holds its tenant
        location = run.remote_job_origin.repository_origin.code_location_origin.location_name
        assert run.tags[PARTITION_TAG] in SHARES[location]
    assert stats.get("status_401", 0) == 0  # no request came with credentials not its own
    for name, truth in truths.items():
        assert counted[name] > 0 and len(seen[name]["requests"]) == counted[name], name
        tenant = found.get(name)
        assert tenant.warehouse == volume / "data" / name / "warehouse.duckdb"
        for entity in ENTITY_SETS:
            held = live_rows(tenant.warehouse, entity)
            assert held == canonical(entity, truth[entity.name]), (name, entity.name)
        patients = canonical(PATIENTS, truth[PATIENTS.name])  # so a mix could not pass
        others = [t for n, t in truths.items() if n != name]
        assert all(patients != canonical(PATIENTS, o[PATIENTS.name]) for o in others)
