"""The definitions with and without a tenants file, and tenants' runs against one sandbox
serving several customers: each tenant's warehouse equals its own customer's data, and holds
nothing of another's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from dagster import (
    EnvVar,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)

from cli.tenants import sandbox_tenants
from connectors.clinical_records import transport
from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.clinical_records.errors import ConfigError
from connectors.sandbox.server import SandboxServer
from pipelines import definitions, tenants
from pipelines.partitions import IN_PROCESS, TENANT_DIMENSION, TENANTS
from pipelines.resources import ClinicalApiResource, TenantApiResource
from pipelines.runner import SyncReport, sync
from pipelines.tenants import Secret, Tenant, Tenants
from tests.sandboxes import serving
from tests.truth import canonical, live_rows

NAMES = ("north", "south")
NIGHT = datetime(2026, 11, 26, 2, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def customers() -> Iterator[SandboxServer]:
    with serving(NAMES, scale=0.05) as server:
        yield server


@pytest.fixture
def tenants_file(customers, tmp_path, monkeypatch) -> Tenants:
    monkeypatch.setenv("CLINICAL_LIMITER_PATH", str(tmp_path / "ratelimit.sqlite"))
    return sandbox_tenants(customers, tmp_path / "tenants.toml")


def sync_tenant(tenant: Tenant, instance) -> SyncReport:
    """The tenant's run in this process, as `clinical-sync sync --tenant` runs it."""
    return sync(
        {},
        lake_root=str(tenant.lake),
        warehouse_path=str(tenant.warehouse),
        tenant=tenant,
        instance=instance,
    )


def tick(schedule, instance, defs):
    """The schedule evaluated at NIGHT as the daemon does (its context closed after)."""
    with build_schedule_context(instance, NIGHT, repository_def=defs.get_repository_def()) as c:
        return schedule.evaluate_tick(c)


def test_without_a_tenants_file_nothing_is_partitioned():
    defs = definitions.build_definitions(None)
    assert all(s.partitions_def is None for s in defs.resolve_all_asset_specs())
    api = defs.resources["clinical_api"]
    assert isinstance(api, ClinicalApiResource) and isinstance(api.api_key, EnvVar)
    assert [s.name for s in defs.sensors] == [
        "mark_failed_runs",
        "alert_failed_runs",
        "alert_inexact_runs",
    ]
    assert not defs.resolve_job_def("nightly_sync").partitions_def


def test_with_a_tenants_file_every_asset_is_partitioned_by_tenant(tenants_file):
    defs = definitions.build_definitions(tenants_file.path)
    specs = defs.resolve_all_asset_specs()
    assert len(specs) == len(definitions.defs.resolve_all_asset_specs())  # the same assets
    assert all(s.partitions_def == TENANTS for s in specs)
    for job in ("nightly_sync", "full_resync", "documents_sync", "backfill_range"):
        assert defs.resolve_job_def(job).partitions_def == TENANTS
    api = defs.resources["clinical_api"]
    assert isinstance(api, TenantApiResource) and api.tenants_file == str(tenants_file.path)
    settings = api.settings("south")  # the tenant's credentials, read from its files now
    assert settings.customer == "south" and settings.scope == "svc-customer-api/south"
    assert defs.resources["warehouse"].published("north") == str(
        tenants_file.get("north").warehouse
    )
    assert defs.resources["lake"].root_of("south") == str(tenants_file.get("south").lake)


def test_the_sensor_keeps_the_partitions_and_the_schedule_runs_each_tenant(tenants_file):
    defs = definitions.build_definitions(tenants_file.path)
    sensor = defs.resolve_sensor_def("tenant_partitions")
    schedule = defs.resolve_schedule_def("nightly_sync_schedule")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(TENANT_DIMENSION, ["gone"])
        with build_sensor_context(instance=instance) as context:
            result = sensor.evaluate_tick(context)
        (added, deleted) = result.dynamic_partitions_requests
        assert (list(added.partition_keys), list(deleted.partition_keys)) == (list(NAMES), ["gone"])
        instance.add_dynamic_partitions(TENANT_DIMENSION, ["north"])  # south not yet
        ticked = tick(schedule, instance, defs)
        assert [r.partition_key for r in ticked.run_requests] == ["north"]
        instance.add_dynamic_partitions(TENANT_DIMENSION, ["south"])
        ticked = tick(schedule, instance, defs)
        assert [r.partition_key for r in ticked.run_requests] == list(NAMES)
        assert len({r.run_key for r in ticked.run_requests}) == 2
        assert all(r.run_config == IN_PROCESS for r in ticked.run_requests)


@pytest.mark.e2e
def test_each_tenant_syncs_into_its_own_warehouse_and_lake(customers, tenants_file):
    before = customers.sandbox.customer_requests()
    with instance_for_test() as instance:
        for tenant in tenants_file:
            report = sync_tenant(tenant, instance)
            assert report.success, report.failure
            run = instance.get_run_by_id(report.run_id)
            assert run.tags["dagster/partition"] == tenant.name
            settings = tenant.settings()
            stored = [entry.to_json() for entry in instance.all_logs(report.run_id)]
            stored.append(str(run.run_config) + str(run.tags))
            for secret in (settings.client_secret, settings.api_key):  # never in Dagster's store
                assert not [text for text in stored if secret in text], tenant.name
        assert set(instance.get_dynamic_partitions(TENANT_DIMENSION)) == set(NAMES)
    after = customers.sandbox.customer_requests()
    for name in NAMES:  # each customer's data was asked for with its own credentials
        assert len(after[name]["requests"]) > len(before[name]["requests"])
    assert customers.stats().get("status_401", 0) == 0
    for tenant in tenants_file:
        other = next(n for n in NAMES if n != tenant.name)
        truth = customers.store_of(tenant.name).ground_truth()
        elsewhere = customers.store_of(other).ground_truth()
        for entity in ENTITY_SETS:
            held = live_rows(tenant.warehouse, entity)
            assert held == canonical(entity, truth[entity.name]), (tenant.name, entity.name)
            if entity.name == "Patients":
                assert held != canonical(entity, elsewhere[entity.name])
        assert Path(tenant.lake, "entity=patients").is_dir()
        with duckdb.connect(str(tenant.warehouse), read_only=True) as con:
            (customer,) = con.execute('SELECT "customer" FROM "ops"."source"').fetchone()
        assert customer == tenant.name


def test_a_tenants_run_reads_its_file_once_and_each_secret_once(tenants_file, monkeypatch):
    """Every step asks for the run's tenant: the file is parsed once in a process while it
    stays the same, and the credentials are read once, to check them before the run, which
    is handed the settings so resolved (not read again by its resources, nor at any step)."""
    parsed: list[Path] = []
    read: list[Secret] = []
    parse, secret = tenants.parse, Secret.read
    monkeypatch.setattr(
        tenants, "parse", lambda text, path: parsed.append(path) or parse(text, path)
    )
    monkeypatch.setattr(Secret, "read", lambda self, env: read.append(self) or secret(self, env))
    tenant = tenants.load(tenants_file.path).get("north")
    with instance_for_test() as instance:
        report = sync_tenant(tenant, instance)
    assert report.success, report.failure
    assert parsed == [tenants_file.path]
    assert sorted(map(str, read)) == sorted(map(str, [tenant.client_secret, tenant.api_key]))
    tenants_file.path.write_text(tenants_file.path.read_text() + "\n# edited\n")
    assert tenants.load(tenants_file.path).names == list(NAMES) and len(parsed) == 2


def test_a_runs_events_hold_its_progress_lines_and_no_request_lines(tenants_file, monkeypatch):
    """What the UI shows of a run's extraction: a progress line (here at every request), never
    the line per request, which would be an event written to the instance each."""
    monkeypatch.setattr(transport, "PROGRESS_SECONDS", 0.0)
    with instance_for_test() as instance:
        report = sync_tenant(tenants_file.get("south"), instance)
        messages = [record.message for record in instance.all_logs(report.run_id)]
    assert report.success, report.failure
    assert any("requests so far in this extraction" in m for m in messages)
    assert not any("status=200" in m for m in messages)


def test_a_run_without_its_tenant_is_refused(tenants_file):
    api = TenantApiResource(tenants_file=str(tenants_file.path))
    with pytest.raises(ConfigError, match="CLINICAL_TENANTS_FILE"):
        api.settings(None)
    with pytest.raises(ConfigError, match="no tenant 'east'"):
        api.settings("east")


def test_a_worker_starts_the_nightly_runs_of_its_share(tenants_file):
    defs = definitions.build_definitions(tenants_file.path, ["south"])
    schedule = defs.resolve_schedule_def("nightly_sync_schedule")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(TENANT_DIMENSION, list(NAMES))
        ticked = tick(schedule, instance, defs)
    assert [r.partition_key for r in ticked.run_requests] == ["south"]
    with pytest.raises(ConfigError, match="no tenant 'west'"):
        definitions.build_definitions(tenants_file.path, ["west"])


def test_the_nightly_time_is_a_setting(tenants_file, monkeypatch):
    monkeypatch.setenv("CLINICAL_NIGHTLY_CRON", "30 3 * * 1-5")
    for file in (None, tenants_file.path):
        schedule = definitions.build_definitions(file).resolve_schedule_def("nightly_sync_schedule")
        assert schedule.cron_schedule == "30 3 * * 1-5"
    monkeypatch.setenv("CLINICAL_NIGHTLY_CRON", "61 2 * * *")
    with pytest.raises(ConfigError, match="CLINICAL_NIGHTLY_CRON: expected a cron expression"):
        definitions.build_definitions(None)
