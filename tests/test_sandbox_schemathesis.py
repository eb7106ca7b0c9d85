"""Property-based conformance: the live sandbox answers as its own `openapi.json` says.

schemathesis generates requests for every operation of the served description, sends them
over HTTP with real credentials, and checks each answer: no server error, a documented
status code, the documented content type, headers and body schema. Random keys mostly
miss, so a second run pins the path keys to records and documents that exist, and the
success bodies (entities, document metadata, file bytes) are checked too. A sandbox of its
own keeps generated uploads and deletes out of the shared fixture's data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from connectors.clinical_records import catalogue as cat
from connectors.sandbox import metadata
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client, fetch_token

pytestmark = pytest.mark.integration

# Small, so both runs together stay well under 40 s on two cores.
MAX_EXAMPLES = 30

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
HYPOTHESIS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same requests every run: a failure is reproducible
    database=None,
)

# Every operation of the description, as (METHOD, path); the served copy is checked to match.
OPERATIONS = [
    (method.upper(), path)
    for path, item in metadata.openapi("http://h/api", "http://h/auth")["paths"].items()
    for method in item
    if method != "parameters"
]
KEYED = [(method, path) for method, path in OPERATIONS if "{" in path]


def label(operation: tuple[str, str]) -> str:
    return " ".join(operation)


@pytest.fixture(scope="module")
def conformance_sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=23, scale=0.05)) as server:
        yield server


@pytest.fixture(scope="module")
def credentials(conformance_sandbox: SandboxServer) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {fetch_token(conformance_sandbox)}",
        "x-api-key": conformance_sandbox.config.api_key,
    }


@pytest.fixture(scope="module")
def served_schema(conformance_sandbox: SandboxServer, credentials: dict[str, str]):
    """The description exactly as the sandbox serves it, not the in-process dict."""
    return schemathesis.openapi.from_url(
        f"{conformance_sandbox.base_url}/openapi.json", headers=credentials, timeout=30
    )


def upload(client: httpx.Client, patient_id: str, name: str) -> str:
    files = {"file": (name, b"%PDF-1.4 conformance", "application/pdf")}
    response = client.post(f"Patients({patient_id})/Documents", files=files)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def existing_keys(conformance_sandbox: SandboxServer) -> dict[str, Any]:
    """A real key per entity set, a kept document and one for DELETE to remove."""
    with api_client(conformance_sandbox) as client:
        keys: dict[str, Any] = {}
        for entity in cat.ENTITY_SETS:
            page = client.get(entity.name, params={"$top": "1", "$select": entity.key})
            keys[entity.name] = page.json()["value"][0][entity.key]
        patient = keys[cat.DOCUMENTS.contained_in or ""]
        keys["kept"] = upload(client, patient, "kept.pdf")
        keys["doomed"] = upload(client, patient, "doomed.pdf")
    return keys


def pinned_keys(method: str, path: str, keys: dict[str, Any]) -> dict[str, Any]:
    """Path parameters naming records that exist: `{id}` of the path's set, `{documentId}`."""
    pinned: dict[str, Any] = {}
    if "{id}" in path:
        pinned["id"] = keys[path.strip("/").split("(")[0]]
    if "{documentId}" in path:
        pinned["documentId"] = keys["doomed" if method == "DELETE" else "kept"]
    return pinned


def test_served_description_has_every_operation(served_schema):
    served = served_schema.raw_schema["paths"]
    listed = [(m.upper(), p) for p, item in served.items() for m in item if m != "parameters"]
    assert sorted(listed) == sorted(OPERATIONS)


def run_conformance(operation: Any, credentials: dict[str, str], **fixed: Any) -> None:
    @given(case=operation.as_strategy(**fixed))
    @HYPOTHESIS
    def conforms(case):
        case.call_and_validate(headers=credentials, checks=CHECKS, timeout=30)

    conforms()


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=list(map(label, OPERATIONS)))
def test_sandbox_conforms_to_its_openapi(served_schema, credentials, method, path):
    """Generated requests for one operation; every answer must match the description."""
    run_conformance(served_schema[path][method], credentials)


@pytest.mark.parametrize(("method", "path"), KEYED, ids=list(map(label, KEYED)))
def test_sandbox_conforms_on_existing_records(
    served_schema, credentials, existing_keys, method, path
):
    """The same, with keys that exist: 200/201/204 bodies are checked, not only errors."""
    keys = pinned_keys(method, path, existing_keys)
    run_conformance(served_schema[path][method], credentials, path_parameters=keys)


def test_existing_records_were_really_served(conformance_sandbox, credentials, existing_keys):
    """Guards the run above against silently testing only 404s: the kept document is there."""
    with api_client(conformance_sandbox) as client:
        kept = client.get(f"document/{existing_keys['kept']}")
        assert kept.status_code == 200
        assert kept.headers["content-type"] == "application/pdf"
        patient = existing_keys[cat.PATIENTS.name]
        assert client.get(f"Patients({patient})").json()["id"] == patient


# -- what schemathesis found once, pinned so it stays fixed ------------------------------------


def error_body(response: httpx.Response) -> dict[str, str]:
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]


def test_skip_beyond_any_table_is_an_empty_page(conformance_sandbox):
    with api_client(conformance_sandbox) as client:
        response = client.get(cat.CLAIMS.name, params={"$skip": "9" * 30, "$top": "5"})
    assert response.status_code == 200
    assert response.json()["value"] == []


def test_a_newline_in_the_path_is_a_404_in_the_error_body(conformance_sandbox):
    with api_client(conformance_sandbox) as client:
        response = client.get("Patients(%0A)/Documents(x)")
    assert response.status_code == 404
    assert error_body(response)["code"] == "NotFound"


def test_an_unreadable_upload_form_is_a_400_in_the_error_body(conformance_sandbox, existing_keys):
    fields = {f"extra{i}": "x" for i in range(20)}
    files = {"file": ("a.pdf", b"%PDF-1.4", "application/pdf")}
    patient = existing_keys[cat.PATIENTS.name]
    with api_client(conformance_sandbox) as client:
        response = client.post(f"Patients({patient})/Documents", data=fields, files=files)
    assert response.status_code == 400
    assert error_body(response)["code"] == "InvalidRequest"
