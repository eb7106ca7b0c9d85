"""What a caller validated reaches the connector, not only what the process environment holds."""

from __future__ import annotations

from connectors.clinical_records.settings import Settings
from pipelines.resources import TUNING, ClinicalApiResource


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
