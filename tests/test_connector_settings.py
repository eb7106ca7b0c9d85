"""Configuration errors name the variable; secrets stay out of repr; transport helpers."""

from __future__ import annotations

import email.utils
import os
import time
from pathlib import Path

import pytest

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from connectors.clinical_records.transport import (
    MAX_RETRY_AFTER,
    MIN_RETRY_AFTER,
    backoff,
    query_string,
    retry_after_seconds,
)

SECRET = "s3cr3t-VALUE-9f8e7d"
API_KEY = "apikey-VALUE-1a2b3c"


def valid_env(**changes: str) -> dict[str, str]:
    env = {
        "CLINICAL_API_BASE_URL": "https://api.example.org/v1",
        "CLINICAL_AUTH_URL": "https://auth.example.org",
        "CLINICAL_CLIENT_ID": "client",
        "CLINICAL_CLIENT_SECRET": SECRET,
        "CLINICAL_API_KEY": API_KEY,
        "CLINICAL_CUSTOMER": "acme",
    }
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def test_defaults_and_values() -> None:
    settings = Settings.from_env(valid_env(), dotenv_path=None)
    assert (settings.rate_limit, settings.burst, settings.max_in_flight) == (2.0, 4, 8)
    assert settings.scope == "svc-customer-api/acme"
    assert settings.limiter_path.name == "ratelimit.sqlite"
    assert settings.ca_bundle is None
    tuned = Settings.from_env(
        valid_env(CLINICAL_RATE_LIMIT="4.5", CLINICAL_BURST="9", CLINICAL_MAX_IN_FLIGHT="3"),
        dotenv_path=None,
    )
    assert (tuned.rate_limit, tuned.burst, tuned.max_in_flight) == (4.5, 9, 3)


def test_repr_hides_secrets() -> None:
    settings = Settings.from_env(valid_env(), dotenv_path=None)
    for text in (repr(settings), str(settings), f"{settings}"):
        assert SECRET not in text and API_KEY not in text
        assert "client_secret=***" in text


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("CLINICAL_API_BASE_URL", None, "non-empty"),
        ("CLINICAL_CLIENT_SECRET", "", "non-empty"),
        ("CLINICAL_API_KEY", "  ", "non-empty"),
        ("CLINICAL_API_BASE_URL", "http://api.example.org", "https://"),
        ("CLINICAL_AUTH_URL", "ftp://auth.example.org", "https://"),
        ("CLINICAL_API_BASE_URL", "https://", "https://"),
        ("CLINICAL_API_BASE_URL", "http://10.0.0.1/api", "https://"),
        ("CLINICAL_CUSTOMER", "a/b", "customer name"),
        ("CLINICAL_RATE_LIMIT", "fast", "a number"),
        ("CLINICAL_RATE_LIMIT", "0", "a number"),
        ("CLINICAL_RATE_LIMIT", "nan", "a number"),
        ("CLINICAL_BURST", "2.5", "an integer"),
        ("CLINICAL_MAX_IN_FLIGHT", "0", "an integer"),
        ("CLINICAL_CA_BUNDLE", "/nonexistent/ca.pem", "PEM file"),
    ],
)
def test_errors_name_the_variable(variable: str, value: str | None, expected: str) -> None:
    env = valid_env(**{variable: value}) if value is not None else valid_env()
    if value is None:
        env.pop(variable)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env, dotenv_path=None)
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: expected ")
    assert expected in str(caught.value)
    assert SECRET not in str(caught.value) and API_KEY not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/api",
        "http://127.5.6.7/api",
        "http://[::1]:9/api",
        "http://localhost/api",
    ],
)
def test_plain_http_only_for_loopback(url: str) -> None:
    assert Settings.from_env(valid_env(CLINICAL_API_BASE_URL=url), dotenv_path=None).base_url == url


def test_dotenv_fills_in_and_env_wins(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        "# comment\nexport CLINICAL_CUSTOMER='from-file'\nCLINICAL_BURST=7\nCLINICAL_RATE_LIMIT=3\n"
    )
    env = valid_env(CLINICAL_RATE_LIMIT="5")
    env.pop("CLINICAL_CUSTOMER")
    settings = Settings.from_env(env, dotenv_path=dotenv)
    assert (settings.customer, settings.burst, settings.rate_limit) == ("from-file", 7, 5.0)


def test_ca_bundle_is_loaded(tmp_path: Path) -> None:
    import certifi

    settings = Settings.from_env(valid_env(CLINICAL_CA_BUNDLE=certifi.where()), dotenv_path=None)
    from connectors.clinical_records.transport import ssl_context

    assert ssl_context(settings).cert_store_stats()["x509_ca"] > 0


def test_ssl_context_is_built_once_and_verifies(tmp_path: Path) -> None:
    """One context per process and bundle, as strict as the default; a bundle rewritten in
    place (a rotated CA) is loaded again."""
    import ssl

    import certifi

    from connectors.clinical_records.transport import ssl_context

    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    settings = Settings.from_env(valid_env(CLINICAL_CA_BUNDLE=str(bundle)), dotenv_path=None)
    first = ssl_context(settings)
    assert ssl_context(settings) is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    plain = Settings.from_env(valid_env(), dotenv_path=None)
    assert ssl_context(plain) is ssl_context(plain) is not first
    assert ssl_context(plain).verify_mode == ssl.CERT_REQUIRED
    os.utime(bundle, ns=(0, 1))
    assert ssl_context(settings) is not first


def test_retry_after_forms_are_bounded() -> None:
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("0") == MIN_RETRY_AFTER
    assert retry_after_seconds("-5") == MIN_RETRY_AFTER
    assert retry_after_seconds("86400") == MAX_RETRY_AFTER
    now = time.time()
    in_ten = email.utils.formatdate(now + 10, usegmt=True)
    assert 8.5 <= retry_after_seconds(in_ten, now=now) <= 10.0
    assert retry_after_seconds(email.utils.formatdate(now - 100, usegmt=True)) == MIN_RETRY_AFTER


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    first = [backoff(1) for _ in range(50)]
    fifth = [backoff(5) for _ in range(50)]
    assert all(0.125 <= d <= 0.25 for d in first)
    assert all(2.0 <= d <= 4.0 for d in fifth)
    assert len(set(fifth)) > 1
    assert max(backoff(40) for _ in range(20)) <= 15.0


def test_query_string_encodes_spaces_and_quotes() -> None:
    assert query_string({"$filter": "a eq 'x y+z&'"}) == "$filter=a%20eq%20%27x%20y%2Bz%26%27"


def test_every_problem_is_reported_at_once() -> None:
    env = valid_env(CLINICAL_BURST="many")
    for name in ("CLINICAL_API_BASE_URL", "CLINICAL_CLIENT_SECRET"):
        env.pop(name)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env, dotenv_path=None)
    lines = str(caught.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "CLINICAL_API_BASE_URL",
        "CLINICAL_CLIENT_SECRET",
        "CLINICAL_BURST",
    ]
    assert "CLINICAL_BURST" in caught.value.variable


@pytest.mark.parametrize(
    "url",
    ["mysql://u:p@db.internal/dagster", "postgresql:///dagster", "postgres://u:p@[::1/dagster"],
)
def test_one_rule_for_the_postgres_url_in_the_settings_and_the_instance_check(url):
    """The limiter's settings and the instance's check read DAGSTER_POSTGRES_URL by one rule
    (connectors/clinical_records/postgres.py), so neither takes a URL the other refuses."""
    from pipelines.postgres import PostgresUnreachable, where

    with pytest.raises(ConfigError, match="DAGSTER_POSTGRES_URL"):
        Settings.from_env(valid_env(DAGSTER_POSTGRES_URL=url), dotenv_path=None)
    with pytest.raises(PostgresUnreachable, match="DAGSTER_POSTGRES_URL: expected postgresql://"):
        where(url)
    good = "postgresql://clinical:pw-7f3a@db.internal:6543/dagster"
    assert where(good) == "db.internal:6543/dagster"
    assert Settings.from_env(valid_env(DAGSTER_POSTGRES_URL=good), dotenv_path=None).limiter_url
