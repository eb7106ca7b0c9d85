"""The tenants file: what it holds, where secrets come from, and one clear line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import tenants
from pipelines.tenants import Secret, TenantsFileError

SECRET = "s3cr3t-VALUE-tenant"
API_KEY = "apikey-VALUE-tenant"

GOOD = """
[defaults]
auth_url = "https://auth.example.org"
rate = 5
burst = 10

[[tenant]]
name = "north"
base_url = "https://api.example.org/v1"
client_id = "north-client"
client_secret = { env = "NORTH_SECRET" }
api_key = { file = "secrets/north.key" }

[[tenant]]
name = "south_2"
customer = "south-clinic"
base_url = "https://api.example.org/v1/"
client_id = { env = "SOUTH_ID" }
client_secret = { env = "SOUTH_SECRET" }
api_key = { env = "SOUTH_KEY" }
rate = 2.5
burst = 4
warehouse = "/srv/clinical/south/warehouse.duckdb"
lake = "lakes/south"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


def test_a_file_lists_its_tenants_with_defaults_and_paths(tmp_path):
    found = tenants.load(write(tmp_path, GOOD))
    assert found.names == ["north", "south_2"]
    north, south = found
    assert (north.customer, north.rate, north.burst) == ("north", 5.0, 10)
    assert north.auth_url == "https://auth.example.org"
    assert north.client_secret == Secret(env="NORTH_SECRET")
    assert north.api_key == Secret(file=tmp_path / "secrets" / "north.key")
    assert north.warehouse == tmp_path / "data" / "north" / "warehouse.duckdb"
    assert north.lake == tmp_path / "data" / "north" / "lake"
    assert (south.customer, south.rate, south.burst) == ("south-clinic", 2.5, 4)
    assert south.base_url == "https://api.example.org/v1"
    assert south.warehouse == Path("/srv/clinical/south/warehouse.duckdb")
    assert south.lake == tmp_path / "lakes" / "south"
    assert found.get("south_2") is south


def test_settings_read_the_credentials_from_variables_and_files(tmp_path):
    found = tenants.load(write(tmp_path, GOOD))
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "north.key").write_text(API_KEY + "\n")
    environ = {"NORTH_SECRET": SECRET, "CLINICAL_RATE_LIMIT": "99", "CLINICAL_MAX_IN_FLIGHT": "3"}
    settings = found.get("north").settings(environ)
    assert (settings.client_secret, settings.api_key) == (SECRET, API_KEY)
    assert (settings.client_id, settings.customer) == ("north-client", "north")
    assert settings.scope == "svc-customer-api/north"
    assert settings.rate_limit == 5.0  # the tenant's own rate, not the environment's
    assert settings.max_in_flight == 3  # the machine's tuning from the environment
    assert SECRET not in repr(found) and API_KEY not in repr(settings)


def test_missing_credentials_name_the_tenant_and_what_to_fix(tmp_path):
    found = tenants.load(write(tmp_path, GOOD))
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "north.key").write_text("")
    with pytest.raises(TenantsFileError) as caught:
        found.get("north").settings({})
    assert caught.value.problems == [
        "tenant 'north': client_secret: environment variable NORTH_SECRET is not set",
        f"tenant 'north': api_key: secret file {tmp_path / 'secrets' / 'north.key'} is empty",
    ]
    with pytest.raises(TenantsFileError, match=r"south_2.*SOUTH_ID is not set"):
        found.get("south_2").settings({"SOUTH_SECRET": "x", "SOUTH_KEY": "y"})
    unreadable = found.get("north").api_key
    with pytest.raises(ValueError, match="cannot be read"):
        Secret(file=tmp_path / "nowhere").read({})
    assert "north.key" in str(unreadable)


BAD = """
[defaults]
auth_url = "https://auth.example.org"
password = "x"

[[tenant]]
name = "north"
base_url = "http://api.example.org/v1"
client_id = "c"
client_secret = "plain-secret-in-the-file"
api_key = { env = "K" }
rate = "fast"

[[tenant]]
name = "north"
base_url = "https://api.example.org"
client_id = "c"
client_secret = { env = "S" }
api_key = { env = "K" }

[[tenant]]
name = "East Side"

[[tenant]]
name = "west"
client_id = "c"
api_key = { vault = "k" }
client_secret = { env = "S" }
burst = 0
colour = "blue"
"""


def test_every_problem_is_one_line_naming_its_tenant(tmp_path):
    with pytest.raises(TenantsFileError) as caught:
        tenants.load(write(tmp_path, BAD))
    problems = caught.value.problems
    path = tmp_path / "tenants.toml"
    assert problems == [
        f"{path}: defaults: 'password' cannot be a default (keys: "
        "base_url, auth_url, client_id, client_secret, api_key, customer, rate, burst, "
        "warehouse, lake)",
        "tenant 'north': client_secret: expected "
        '{ env = "VARIABLE" } or { file = "PATH" }, never the secret itself',
        "tenant 'north': base_url: expected an https:// URL "
        "(http:// only for 127.0.0.0/8, ::1 or localhost)",
        "tenant 'north': rate: expected a number >= 0.01",
        "tenant 'north': named twice (tenants 1 and 2)",
        "tenant 3: name: expected 1 to 63 lowercase letters, digits, '-' or '_', starting with "
        "a letter or digit, got 'East Side'",
        "tenant 'west': unknown key 'colour' (keys: name, base_url, auth_url, client_id, "
        "client_secret, api_key, customer, rate, burst, warehouse, lake)",
        "tenant 'west': base_url: missing",
        "tenant 'west': api_key: expected "
        '{ env = "VARIABLE" } or { file = "PATH" }, never the secret itself',
        "tenant 'west': burst: expected an integer >= 1",
    ]
    assert "plain-secret-in-the-file" not in str(caught.value)
    assert caught.value.variable == tenants.TENANTS_VARIABLE


def test_an_unreadable_or_broken_file_is_one_line(tmp_path):
    with pytest.raises(TenantsFileError, match="cannot be read"):
        tenants.load(tmp_path / "missing.toml")
    with pytest.raises(TenantsFileError, match="not valid TOML"):
        tenants.load(write(tmp_path, "[[tenant]\nname = 1"))
    with pytest.raises(TenantsFileError, match=r"no tenant 'nobody'.*tenants: north, south_2"):
        tenants.load(write(tmp_path, GOOD)).get("nobody")


def test_the_variable_names_the_file(tmp_path):
    assert tenants.configured({}) is None
    assert tenants.configured({"CLINICAL_TENANTS_FILE": " "}) is None
    path = write(tmp_path, GOOD)
    assert tenants.configured({"CLINICAL_TENANTS_FILE": str(path)}) == path
