"""One sandbox serving several customers over HTTP: each customer's credentials reach its own
data only, and each API key has its own rate limit."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from connectors.clinical_records.catalogue import SCOPE_PREFIX
from connectors.sandbox.config import Customer, SandboxConfig
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.server import SandboxServer
from pipelines import tenants
from tests.test_sandbox_cli import served

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two() -> Iterator[SandboxServer]:
    config = SandboxConfig(
        scale=0.05,
        customers=[Customer("north", seed=1), Customer("south", seed=2, rate=1, burst=1)],
    )
    with SandboxServer(config) as server:
        yield server


def token(server: SandboxServer, client: str, scope_of: str | None = None) -> httpx.Response:
    c = next(c for c in server.customers if c.name == client)
    return httpx.post(
        f"{server.auth_url}/oauth2/token",
        data={
            "grant_type": "client_credentials",
            "client_id": c.client_id,
            "client_secret": c.client_secret,
            "scope": f"{SCOPE_PREFIX}{scope_of or client}",
        },
    )


def get(server: SandboxServer, path: str, bearer: str, api_key: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {bearer}", "x-api-key": api_key}
    return httpx.get(f"{server.base_url}/{path}", headers=headers, timeout=30)


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [str(r["id"]) for r in response.json()["value"]]


def key(server: SandboxServer, name: str) -> str:
    return server.env(name)["CLINICAL_API_KEY"]


def test_each_customer_reads_its_own_data_and_never_anothers(two):
    north = token(two, "north").json()["access_token"]
    south = token(two, "south").json()["access_token"]
    seen_north = ids(get(two, "Patients?$top=20", north, key(two, "north")))
    seen_south = ids(get(two, "Patients?$top=20", south, key(two, "south")))
    truth = {name: two.store_of(name).ground_truth()["Patients"] for name in ("north", "south")}
    assert seen_north == [str(r["id"]) for r in truth["north"][:20]]
    assert seen_south == [str(r["id"]) for r in truth["south"][:20]]
    assert truth["north"][:20] != truth["south"][:20]  # different data, so a mix would show
    crossed = get(two, "Patients?$top=1", north, key(two, "south"))  # A's token, B's key
    assert crossed.status_code == 401
    assert "another customer" in crossed.json()["error"]["details"]
    requests = two.sandbox.customer_requests()
    assert len(requests["north"]["requests"]) == 1 and len(requests["south"]["requests"]) == 1


def test_a_client_cannot_ask_for_another_customers_scope(two):
    refused = token(two, "north", scope_of="south")
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_scope"
    wrong = httpx.post(
        f"{two.auth_url}/oauth2/token",
        data={
            "grant_type": "client_credentials",
            "client_id": two.env("north")["CLINICAL_CLIENT_ID"],
            "client_secret": two.env("south")["CLINICAL_CLIENT_SECRET"],
            "scope": f"{SCOPE_PREFIX}north",
        },
    )
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"


def test_each_api_key_has_its_own_rate_limit(two):
    north = token(two, "north").json()["access_token"]
    south = token(two, "south").json()["access_token"]
    time.sleep(1.1)  # south's bucket full again (1 token) whatever the tests before spent
    with ThreadPoolExecutor(8) as pool:  # eight at once: south allows 1 per second, burst 1
        asked = pool.map(lambda _: get(two, "Branches?$top=1", south, key(two, "south")), range(8))
        statuses = [response.status_code for response in asked]
    assert 429 in statuses and 200 in statuses
    # south is throttled; north, on the same server at the same moment, is not limited at all
    assert all(
        get(two, "Branches?$top=1", north, key(two, "north")).status_code == 200 for _ in range(20)
    )
    assert two.sandbox.customer_requests()["south"]["throttled"] >= 1
    assert two.sandbox.customer_requests()["north"]["throttled"] == 0


def test_the_controls_act_on_the_customer_whose_key_authorises_them(two):
    south = two.control("south").truth()["Patients"]
    assert south == two.store_of("south").ground_truth()["Patients"]
    assert two.control("north").truth()["Patients"] != south
    assert set(SandboxControl.from_env(two.env("south")).call("customers")) == {"north", "south"}


def test_the_settings_of_each_customer(two):
    north, south = two.env("north"), two.env("south")
    assert north["CLINICAL_CUSTOMER"] == "north" and south["CLINICAL_CUSTOMER"] == "south"
    assert north["CLINICAL_CLIENT_ID"] == "north-client"
    assert "CLINICAL_RATE_LIMIT" not in north  # no limit: the sandbox's (none)
    assert (south["CLINICAL_RATE_LIMIT"], south["CLINICAL_BURST"]) == ("1", "1")
    assert north["CLINICAL_API_BASE_URL"] == south["CLINICAL_API_BASE_URL"]
    assert two.env() == north  # the first customer is the default


def test_one_customer_by_default_and_no_two_alike():
    config = SandboxConfig()
    (only,) = config.served()
    assert (only.name, only.client_id, only.api_key) == (
        config.customer,
        config.client_id,
        config.api_key,
    )
    with pytest.raises(ValueError, match="share a name"):
        SandboxConfig(customers=[Customer("a"), Customer("a")])


def test_the_one_customers_settings_are_refused_beside_customers():
    """With `customers` each customer has its own credentials: the one customer's fields hold
    nothing (no default is kept for nobody), and a value given for them is refused."""
    several = SandboxConfig(customers=[Customer("a"), Customer("b")])
    assert (several.customer, several.client_id, several.client_secret, several.api_key) == (
        None,
        None,
        None,
        None,
    )
    with pytest.raises(ValueError, match="client_secret, api_key: the one customer's"):
        SandboxConfig(customers=[Customer("a")], client_secret="s", api_key="k")
    one = SandboxConfig()
    one.customers = [Customer("a")]  # given after the one customer's were drawn
    with pytest.raises(ValueError, match="customer, client_id, client_secret, api_key"):
        one.served()


def test_the_command_serves_customers_side_by_side_and_writes_their_tenants_file(tmp_path):
    path = tmp_path / "tenants.toml"
    with served("--customers", "3", "--rate", "7", "--tenants-file", str(path)) as (env, _):
        assert env["CLINICAL_CUSTOMER"] == "clinic-3"  # the last of three blocks
        found = tenants.load(path)
        assert found.names == ["clinic-1", "clinic-2", "clinic-3"]
        text = path.read_text()
        for tenant in found:
            settings = tenant.settings({})
            assert (settings.rate_limit, settings.burst) == (7.0, 10)
            assert settings.client_secret not in text and settings.api_key not in text
            response = httpx.post(
                f"{settings.auth_url}/oauth2/token",
                data={
                    "grant_type": "client_credentials",
                    "client_id": settings.client_id,
                    "client_secret": settings.client_secret,
                    "scope": settings.scope,
                },
            )
            assert response.status_code == 200, tenant.name
    secrets = tmp_path / "tenants.secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in secrets.iterdir()} == {0o600}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
