"""Conformance of the sandbox to the spec, over real HTTP on 127.0.0.1 (spec sections 1, 4, 5, 7, 8)."""

from __future__ import annotations

import time

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client, fetch_token

pytestmark = pytest.mark.integration


def error_of(response: httpx.Response) -> dict[str, str]:
    """The spec's error body (section 7): code, message and details, all strings."""
    body = response.json()["error"]
    assert set(body) == {"code", "message", "details"}
    assert all(isinstance(v, str) for v in body.values())
    return body


# -- section 5: the token service ---------------------------------------------------------


def token_form(server: SandboxServer, **override: str) -> dict[str, str]:
    form = {
        "grant_type": "client_credentials",
        "client_id": server.config.client_id,
        "client_secret": server.config.client_secret,
        "scope": f"svc-customer-api/{server.config.customer}",
    }
    return {**form, **override}


def test_token_is_issued_for_client_credentials(sandbox):
    response = httpx.post(f"{sandbox.auth_url}/oauth2/token", data=token_form(sandbox))
    assert response.status_code == 200
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 300
    assert len(body["access_token"]) >= 32


@pytest.mark.parametrize(
    ("override", "status", "code"),
    [
        ({"client_secret": "wrong"}, 401, "invalid_client"),
        ({"client_id": "someone-else"}, 401, "invalid_client"),
        ({"scope": "svc-customer-api/other-clinic"}, 400, "invalid_scope"),
        ({"scope": "customer-api/demo-clinic"}, 400, "invalid_scope"),
        ({"grant_type": "password"}, 400, "unsupported_grant_type"),
    ],
)
def test_token_errors_name_the_cause(sandbox, override, status, code):
    response = httpx.post(f"{sandbox.auth_url}/oauth2/token", data=token_form(sandbox, **override))
    assert response.status_code == status
    assert response.json()["error"] == code


def test_token_request_must_be_a_form(sandbox):
    response = httpx.post(f"{sandbox.auth_url}/oauth2/token", json=token_form(sandbox))
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-api-key": "API"},  # a key but no token
        {"Authorization": "Bearer TOKEN"},  # a token but no key
        {"Authorization": "bearer TOKEN", "x-api-key": "API"},  # the word is case-sensitive
        {"Authorization": "Bearer not-a-token", "x-api-key": "API"},
        {"Authorization": "Bearer TOKEN", "x-api-key": "wrong-key"},
    ],
)
def test_every_api_request_needs_bearer_token_and_api_key(sandbox, headers):
    token = fetch_token(sandbox)
    filled = {
        k: v.replace("TOKEN", token).replace("API", sandbox.config.api_key)
        for k, v in headers.items()
    }
    for path in ("Patients", "$metadata", "", "document/anything"):
        response = httpx.get(f"{sandbox.base_url}/{path}", headers=filled)
        assert response.status_code == 401, path
        assert error_of(response)["code"] == "Unauthorized"


def test_token_expires_after_its_lifetime():
    with SandboxServer(SandboxConfig(scale=0.02, token_lifetime=0.5)) as server:
        with api_client(server) as client:
            assert client.get("Branches").status_code == 200
            time.sleep(0.7)
            response = client.get("Branches")
        assert response.status_code == 401
        assert "expired" in error_of(response)["details"]


# -- section 4.1: service level -----------------------------------------------------------


def test_service_document_lists_the_eight_entity_sets(api):
    body = api.get("").json()
    assert body["@odata.context"].endswith("/$metadata")
    assert [s["name"] for s in body["value"]] == [e.name for e in cat.ENTITY_SETS]


def test_metadata_is_edmx(api):
    response = api.get("$metadata")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/xml")
    for ent in cat.ENTITY_SETS:
        assert f'EntitySet Name="{ent.name}"' in response.text


def test_openapi_description_is_valid_openapi_3(api, sandbox):
    from openapi_spec_validator import validate

    spec = api.get("openapi.json").json()
    validate(spec)
    assert spec["openapi"].startswith("3.0")
    assert spec["servers"][0]["url"] == sandbox.base_url


# -- section 4.2: entity sets -------------------------------------------------------------


@pytest.mark.parametrize("entity", cat.ENTITY_SETS, ids=lambda e: e.name)
def test_collection_envelope_and_count(api, sandbox, entity):
    response = api.get(entity.name, params={"$count": "true", "$top": "5", "$orderby": "id asc"})
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["@odata.context", "@odata.count", "value"]
    assert body["@odata.context"].endswith(f"/$metadata#{entity.name}")
    assert body["@odata.count"] == len(sandbox.store.table(entity.name).rows)
    assert len(body["value"]) == min(5, body["@odata.count"])
    assert set(body["value"][0]) == set(entity.by_name)


def test_count_is_absent_unless_asked(api):
    assert "@odata.count" not in api.get("Branches").json()


def test_paging_by_skip_reads_every_record_once(api, sandbox):
    ids: list[str] = []
    total = None
    skip = 0
    while total is None or skip < total:
        body = api.get(
            "Physicians",
            params={"$count": "true", "$top": "100", "$skip": str(skip), "$orderby": "id asc"},
        ).json()
        total = body["@odata.count"]
        ids += [r["id"] for r in body["value"]]
        skip += 100
    assert ids == sorted(r["id"] for r in sandbox.store.ground_truth()["Physicians"])


def test_default_and_maximum_page_size_is_100(api):
    assert len(api.get("Appointments").json()["value"]) == 100
    assert len(api.get("Appointments", params={"$top": "100"}).json()["value"]) == 100
    response = api.get("Appointments", params={"$top": "101"})
    assert response.status_code == 400
    assert error_of(response)["code"] == "InvalidQueryOption"
    assert "100" in error_of(response)["message"] + error_of(response)["details"]


def test_paging_is_applied_after_filtering(api, sandbox):
    truth = [r for r in sandbox.store.table("Appointments").rows if r["status"] == "Completed"]
    body = api.get(
        "Appointments",
        params={
            "$filter": "status eq 'Completed'",
            "$count": "true",
            "$top": "10",
            "$skip": "3",
            "$orderby": "id",
        },
    ).json()
    assert body["@odata.count"] == len(truth)
    assert [r["id"] for r in body["value"]] == [r["id"] for r in truth[3:13]]


def test_keyset_filter_on_a_numeric_key(api, sandbox):
    keys = sandbox.store.table("Claims").keys
    pivot = keys[len(keys) // 2]
    body = api.get(
        "Claims", params={"$filter": f"id gt {pivot}", "$orderby": "id asc", "$top": "100"}
    ).json()
    assert [r["id"] for r in body["value"]] == [k for k in keys if k > pivot][:100]


def test_filter_on_date_time_compares_instants(api, sandbox):
    rows = sandbox.store.table("Appointments").rows
    body = api.get(
        "Appointments",
        params={"$filter": "updated_at ge 2000-01-01T00:00:00Z", "$count": "true", "$top": "0"},
    ).json()
    assert body["@odata.count"] == sum(1 for r in rows if r["updated_at"] is not None)


def test_a_long_or_chain_and_deep_parentheses_are_answered(api, sandbox):
    """600 alternatives fit in a URL and once overflowed the stack (a 500)."""
    keys = sandbox.store.table("Claims").keys
    chain = " or ".join(f"id eq {k}" for k in keys[:600])
    body = api.get("Claims", params={"$filter": chain, "$count": "true", "$top": "0"}).json()
    assert body["@odata.count"] == min(600, len(keys))
    nested = "(" * 100 + f"id eq {keys[0]}" + ")" * 100
    assert [r["id"] for r in api.get("Claims", params={"$filter": nested}).json()["value"]] == [
        keys[0]
    ]


def test_select_and_orderby_desc(api):
    body = api.get("Branches", params={"$select": "id,name", "$orderby": "id desc"}).json()
    assert all(set(r) == {"id", "name"} for r in body["value"])
    ids = [r["id"] for r in body["value"]]
    assert ids == sorted(ids, reverse=True)


@pytest.mark.parametrize(
    ("params", "code", "needle"),
    [
        ({"$filter": "no_such_field eq 1"}, "InvalidFilter", "no_such_field"),
        ({"$filter": "id eq 'x'"}, "InvalidFilter", "id"),
        ({"$filter": "status eq"}, "InvalidFilter", ""),
        ({"$orderby": "nope asc"}, "InvalidQueryOption", "nope"),
        ({"$select": "id,nope"}, "InvalidQueryOption", "nope"),
        ({"$expand": "Nope"}, "InvalidQueryOption", "Nope"),
        ({"$skip": "-1"}, "InvalidQueryOption", ""),
        ({"$count": "maybe"}, "InvalidQueryOption", ""),
        ({"$search": "x"}, "InvalidQueryOption", "$search"),
        # Deeper than Python's stack: a 400 that says why, not a 500.
        ({"$filter": "(" * 101 + "id eq 1" + ")" * 101}, "InvalidFilter", "deeper than 100"),
        ({"$filter": "not " * 300 + "active"}, "InvalidFilter", "deeper than 100"),
        ({"$filter": "id eq 1" + "0" * 5000}, "InvalidFilter", "Invalid integer"),
    ],
)
def test_bad_queries_get_the_error_body(api, params, code, needle):
    entity = "Prescriptions"
    response = api.get(entity, params=params)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == code
    assert needle in error["message"] + error["details"]


def test_unknown_property_is_named_in_details(api):
    response = api.get("Patients", params={"$filter": "favourite_colour eq 'blue'"})
    assert "favourite_colour" in error_of(response)["details"]


def test_a_query_option_given_twice_is_refused(api):
    response = api.get("Branches?$top=1&$top=2")
    assert response.status_code == 400
    assert error_of(response)["code"] == "InvalidQueryOption"


def test_single_entity_with_numeric_and_string_keys(api, sandbox):
    prescription = sandbox.store.table("Prescriptions").rows[0]
    body = api.get(f"Prescriptions({prescription['id']})").json()
    assert body["@odata.context"].endswith("/$metadata#Prescriptions/$entity")
    assert body["id"] == prescription["id"]
    appointment = sandbox.store.table("Appointments").rows[0]
    assert api.get(f"Appointments({appointment['id']})").json()["id"] == appointment["id"]


def test_single_entity_errors(api):
    missing = api.get("Prescriptions(999999999)")
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "NotFound"
    bad_key = api.get("Prescriptions(abc)")
    assert bad_key.status_code == 400
    assert error_of(bad_key)["code"] == "InvalidKey"


def test_unknown_resource_is_404(api):
    response = api.get("Invoices")
    assert response.status_code == 404
    assert error_of(response)["code"] == "NotFound"


def test_expand_with_nested_options_and_depth_limit(api, sandbox):
    claims = sandbox.store.table("Claims").rows
    with_parent = next(
        c for c in claims if sandbox.store.table("Prescriptions").get(c["prescription_id"])
    )
    pid = with_parent["prescription_id"]
    body = api.get(
        f"Prescriptions({pid})",
        params={"$expand": "Claims($orderby=id desc;$select=id,prescription_id),Patient"},
    ).json()
    assert body["Claims"], "the prescription has at least the claim we started from"
    assert all(c["prescription_id"] == pid for c in body["Claims"])
    assert [c["id"] for c in body["Claims"]] == sorted(
        (c["id"] for c in body["Claims"]), reverse=True
    )
    assert body["Patient"] is None or str(body["Patient"]["id"]) == str(body["patient_id"])
    deep = api.get(
        "Branches",
        params={"$expand": "Children($expand=Children($expand=Children($expand=Children)))"},
    )
    assert deep.status_code == 400
    ok = api.get("Branches", params={"$expand": "Children($expand=Children($expand=Children))"})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PATCH", "Patients"),
        ("PUT", "Prescriptions(1)"),
        ("POST", "Claims"),
        ("DELETE", "Branches(1)"),
        ("PATCH", "$metadata"),
    ],
)
def test_writes_are_refused_with_the_error_body(api, method, path):
    response = api.request(method, path, json={})
    assert response.status_code == 405
    assert error_of(response)["code"] == "MethodNotAllowed"
    assert "POST" not in response.headers["allow"] or "Documents" in path
