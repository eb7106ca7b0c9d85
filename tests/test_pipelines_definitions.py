"""The Dagster definitions load, validate, and hold what operators rely on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, EnvVar

from connectors.clinical_records.catalogue import ALL_ENTITIES, DOCUMENTS, ENTITY_SETS
from pipelines import definitions
from pipelines.checks import (
    FRESH_WITHIN,
    MATCHES_SOURCE,
    RECONCILED,
    REFERENCES,
    REJECTS,
    SETTLED,
    STALENESS,
    references_by_table,
)
from pipelines.documents_asset import CONTENT_KEY
from pipelines.keys import (
    API_POOL,
    EXACTNESS_KEY,
    PUBLISHED_KEY,
    WAREHOUSE_POOL,
    lake_key,
    table_key,
)
from sync.budget import needs_whole

ROOT = Path(__file__).resolve().parents[1]
defs = definitions.defs


def validate(**settings: str) -> subprocess.CompletedProcess:
    """`dagster definitions validate` as on a fresh clone: no DAGSTER_HOME, so Dagster reads
    ./dagster.yaml from the root."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    cli = Path(sys.executable).with_name("dagster")
    return subprocess.run(
        [str(cli), "definitions", "validate", "-m", "pipelines.definitions"],
        cwd=ROOT,
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dagster_definitions_validate_passes():
    done = validate()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Validation successful" in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CLINICAL_ALERT_WEBHOOK", "http://hooks.example.com/T0/B0/secret-part"),
        ("CLINICAL_NIGHTLY_CRON", "every night"),
    ],
)
def test_a_bad_webhook_or_schedule_stops_the_code_location_naming_the_variable(variable, value):
    done = validate(**{variable: value})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"{variable}: expected" in output
    assert "secret-part" not in output  # the value is never shown


def test_one_extraction_and_one_table_per_entity_set_and_the_models():
    graph = defs.resolve_asset_graph()
    keys = set(graph.get_all_asset_keys())
    expected = {k for e in ENTITY_SETS for k in (lake_key(e), table_key(e))}
    assert expected <= keys
    models = {k for k in keys if k.path[0] == "analytics"}
    assert AssetKey(["analytics", "prescription_claims"]) in models
    documents = {lake_key(DOCUMENTS), table_key(DOCUMENTS), CONTENT_KEY}
    assert keys == expected | models | documents | {PUBLISHED_KEY, EXACTNESS_KEY}
    # Published once everything that writes the warehouse has committed.
    assert graph.get(PUBLISHED_KEY).parent_keys == keys - {PUBLISHED_KEY}
    # The run's end after every table's load, the models after it (they read what it loads).
    assert graph.get(EXACTNESS_KEY).parent_keys == {table_key(e) for e in ALL_ENTITIES}
    for model in models:
        assert EXACTNESS_KEY in graph.get(model).parent_keys
    node = graph.get(AssetKey(["analytics", "prescription_claims"]))
    assert {table_key(e) for e in ENTITY_SETS if e.table in ("claims", "prescriptions")} <= set(
        node.parent_keys
    )
    for entity in (*ENTITY_SETS, DOCUMENTS):
        assert graph.get(table_key(entity)).parent_keys == {lake_key(entity)}


def test_pools_kinds_owners_and_descriptions():
    for assets_def in defs.resolve_all_asset_specs():
        assert assets_def.description, assets_def.key
        assert assets_def.owners and assets_def.kinds, assets_def.key
    graph = defs.resolve_asset_graph()
    for entity in ENTITY_SETS:
        assert graph.get(lake_key(entity)).pools == {API_POOL}
        assert graph.get(table_key(entity)).pools == {WAREHOUSE_POOL}
    assert graph.get(PUBLISHED_KEY).pools == {WAREHOUSE_POOL}
    assert graph.get(EXACTNESS_KEY).pools == {WAREHOUSE_POOL}  # it loads what it looks at


def test_jobs_schedule_and_sensor_exist():
    for name in ("nightly_sync", "full_resync", "documents_sync", "backfill_range"):
        assert defs.resolve_job_def(name) is not None
    schedule = defs.resolve_schedule_def("nightly_sync_schedule")
    assert schedule.cron_schedule == "0 2 * * *"
    assert schedule.job_name == "nightly_sync"
    assert schedule.execution_timezone == "UTC"
    for sensor in ("mark_failed_runs", "alert_failed_runs", "alert_inexact_runs"):
        assert defs.resolve_sensor_def(sensor).default_status.value == "RUNNING"


def test_checks_exist_for_every_table():
    graph = defs.resolve_asset_graph()
    checks = set(graph.asset_check_keys)
    for entity in ENTITY_SETS:
        for name in (MATCHES_SOURCE, REJECTS, RECONCILED):
            assert AssetCheckKey(table_key(entity), name) in checks
        assert (AssetCheckKey(table_key(entity), STALENESS) in checks) == needs_whole(entity)
    by_table = references_by_table()
    targets = {(s.name, r.target.name) for s, refs in by_table.items() for r in refs}
    assert {
        ("Claims", "Prescriptions"),
        ("InsuranceVerifications", "Prescriptions"),
        ("Prescriptions", "Patients"),
    } <= targets
    for source, refs in by_table.items():  # one check per table, after every table it reads
        key = AssetCheckKey(table_key(source), REFERENCES)
        assert key in checks
        deps = graph.get(key).parent_entity_keys
        assert {table_key(r.target) for r in refs} <= deps | {table_key(source)}
    # The run's exactness, decided in one place for every set.
    assert AssetCheckKey(EXACTNESS_KEY, SETTLED) in checks
    # Three events and a materialization lookup each, per run and tenant: kept to the questions
    # an operator acts on (the count, reconciliation, what was set aside, staleness, references).
    tables = ALL_ENTITIES  # the documents' table too
    assert len(checks) == 3 * len(tables) + sum(map(needs_whole, tables)) + len(by_table) + 1


def test_every_table_has_a_freshness_policy():
    specs = {spec.key: spec for spec in defs.resolve_all_asset_specs()}
    for entity in ENTITY_SETS:
        policy = specs[table_key(entity)].freshness_policy
        assert policy is not None and policy.fail_window.to_timedelta() == FRESH_WITHIN


def test_every_table_shows_its_columns_with_the_specs_meanings():
    specs = {spec.key: spec for spec in defs.resolve_all_asset_specs()}
    for entity in [*ENTITY_SETS, DOCUMENTS]:
        schema = specs[table_key(entity)].metadata["dagster/column_schema"]
        columns = {c.name: c for c in schema.columns}
        for field in entity.fields:
            assert columns[field.name].description == field.meaning, (entity.name, field.name)
            assert columns[field.name].type == field.canonical.value
        assert "_deleted_at" in columns


def test_secrets_are_env_vars_never_values():
    api = definitions.resources()["clinical_api"]
    for name in ("client_secret", "api_key", "client_id", "base_url", "auth_url", "customer"):
        assert isinstance(getattr(api, name), EnvVar), name


def test_a_bad_timezone_names_the_variable(monkeypatch):
    from connectors.clinical_records.errors import ConfigError

    monkeypatch.setenv("CLINICAL_TIMEZONE", "Mars/Olympus")
    with pytest.raises(ConfigError, match="CLINICAL_TIMEZONE"):
        definitions.timezone()
    monkeypatch.setenv("CLINICAL_TIMEZONE", "Europe/Berlin")
    assert definitions.timezone() == "Europe/Berlin"


def test_instance_yaml_limits_both_pools_to_one_and_turns_telemetry_off(tmp_path, monkeypatch):
    from dagster import DagsterInstance

    (tmp_path / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        assert not instance.telemetry_enabled


def test_dagster_home_gets_the_instance_yaml_and_keeps_an_operators_own(tmp_path, monkeypatch):
    from pipelines import home

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "fresh"))
    written = (home.dagster_home() / "dagster.yaml").read_text()
    ours = home.INSTANCE_YAML.read_text()
    assert written.startswith(ours)  # the repository's file, then this home's storage
    assert yaml.safe_load(written) == {
        **yaml.safe_load(ours),
        "storage": home.sqlite_storage(tmp_path / "fresh"),
    }
    own = tmp_path / "own"
    own.mkdir()
    (own / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(own))
    home.dagster_home()
    assert (own / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_a_run_takes_one_step_of_each_pool_at_a_time_and_in_process_stays_possible(monkeypatch):
    """The executor's limit per pool within a run (the instance's pools only hold across
    runs); the launchpad's `in_process` choice is left as Dagster has it."""
    from dagster._core.system_config.objects import ResolvedRunConfig

    for name in ("API_BASE_URL", "AUTH_URL", "CLIENT_ID", "CLIENT_SECRET", "API_KEY", "CUSTOMER"):
        monkeypatch.setenv(f"CLINICAL_{name}", "x")
    job = defs.resolve_job_def("nightly_sync")
    default = ResolvedRunConfig.build(job, {}).execution.execution_engine_config
    assert default["multiprocess"]["tag_concurrency_limits"] == definitions.ONE_STEP_PER_POOL
    chosen = {"execution": {"config": {"in_process": {}}}}
    assert "in_process" in ResolvedRunConfig.build(job, chosen).execution.execution_engine_config
    graph = defs.resolve_asset_graph()
    for entity in ENTITY_SETS:
        for key, pool in ((lake_key(entity), API_POOL), (table_key(entity), WAREHOUSE_POOL)):
            node = graph.get(key)
            assert node.pools == {pool}
            assert defs.resolve_assets_def(key).op.tags["clinical-sync/pool"] == pool
