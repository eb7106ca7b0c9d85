"""What a caller validated reaches the connector, not only what the process environment holds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from pipelines.resources import TUNING, ClinicalApiResource, SyncOptionsResource


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
    assert ClinicalApiResource.from_settings(settings).settings() == settings


def test_run_options_are_validated_with_the_setting_named():
    options = SyncOptionsResource(backfill_from="2026-10-01", lookback_minutes=15).options()
    assert options.backfill and options.lookback == timedelta(minutes=15)
    with pytest.raises(ConfigError, match="backfill_from"):
        SyncOptionsResource(backfill_from="YYYY-MM-DD").options()
    with pytest.raises(ConfigError, match="backfill_from"):
        SyncOptionsResource(backfill_to="2026-10-01").options()
    with pytest.raises(ConfigError, match="backfill_to"):
        SyncOptionsResource(backfill_from="2026-10-02", backfill_to="2026-10-01").options()
