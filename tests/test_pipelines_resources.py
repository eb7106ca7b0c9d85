"""What a caller validated reaches the connector, not only what the process environment holds,
and never the instance."""

from __future__ import annotations

import contextlib
import sqlite3
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from pipelines.resources import TUNING, SettledApiResource, SyncOptionsResource


def test_every_validated_setting_reaches_the_client(tmp_path, monkeypatch):
    for variable in TUNING.values():
        monkeypatch.delenv(variable, raising=False)
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    given = {
        "CLINICAL_API_BASE_URL": "http://127.0.0.1:9/api",
        "CLINICAL_AUTH_URL": "http://127.0.0.1:9",
        "CLINICAL_CLIENT_ID": "id",
        "CLINICAL_CLIENT_SECRET": "secret",
        "CLINICAL_API_KEY": "key",
        "CLINICAL_CUSTOMER": "acme",
        "CLINICAL_RATE_LIMIT": "3",
        "CLINICAL_BURST": "5",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "bucket.sqlite"),
        "CLINICAL_CA_BUNDLE": str(ca),
        "CLINICAL_CONNECT_TIMEOUT": "2",
        "CLINICAL_READ_TIMEOUT": "7",
        "CLINICAL_MAX_IN_FLIGHT": "3",
        "CLINICAL_MAX_ATTEMPTS": "2",
        "CLINICAL_RETRY_BUDGET": "9",
    }
    settings = Settings.from_env(given, dotenv_path=None)
    assert SettledApiResource.holding(settings).settings() == settings


def test_a_runs_settings_never_reach_the_instance(tmp_path):
    """Dagster stores a resource's field values in the instance, with the run's job snapshot
    (compressed): an in-process run's credentials reach it by a handle in the process."""
    from dagster import AssetSelection, DagsterInstance, Definitions, asset, define_asset_job

    secret, key = "SECRET-8f2c1e9a7b", "APIKEY-5d0b3c6e1f"
    settings = Settings.from_env(
        {
            "CLINICAL_API_BASE_URL": "http://127.0.0.1:9/api",
            "CLINICAL_AUTH_URL": "http://127.0.0.1:9",
            "CLINICAL_CLIENT_ID": "id",
            "CLINICAL_CLIENT_SECRET": secret,
            "CLINICAL_API_KEY": key,
            "CLINICAL_CUSTOMER": "acme",
        },
        dotenv_path=None,
    )

    @asset
    def reads_its_settings(clinical_api: SettledApiResource) -> None:
        assert clinical_api.settings().client_secret == secret

    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        defs = Definitions(
            assets=[reads_its_settings],
            jobs=[define_asset_job("job", AssetSelection.all())],
            resources={"clinical_api": SettledApiResource.holding(settings)},
        )
        assert defs.resolve_job_def("job").execute_in_process(instance=instance).success
    stored = [value for db in tmp_path.rglob("*.db") for value in sqlite_values(db)]
    assert any(b"reads_its_settings" in value for value in stored)  # the snapshot was read
    assert not [v for v in stored if secret.encode() in v or key.encode() in v]


def test_run_options_are_validated_with_the_setting_named():
    options = SyncOptionsResource(backfill_from="2026-10-01", lookback_minutes=15).options()
    assert options.backfill and options.lookback == timedelta(minutes=15)
    with pytest.raises(ConfigError, match="backfill_from"):
        SyncOptionsResource(backfill_from="YYYY-MM-DD").options()
    with pytest.raises(ConfigError, match="backfill_from"):
        SyncOptionsResource(backfill_to="2026-10-01").options()
    with pytest.raises(ConfigError, match="backfill_to"):
        SyncOptionsResource(backfill_from="2026-10-02", backfill_to="2026-10-01").options()


def sqlite_values(database: Path) -> Iterator[bytes]:
    """Every value of every table of a SQLite file (Dagster's instance), compressed ones
    unpacked: what a search of the file's bytes alone would miss."""
    with sqlite3.connect(database) as con:
        tables = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in con.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        with contextlib.suppress(zlib.error):
                            value = zlib.decompress(value)
                        yield value
                    else:
                        yield str(value).encode()
