"""`$expand=Documents` on Patients over real HTTP (spec 4.2, 4.3), and the two switches that
make a client's fallbacks testable: a cap on expanded collections and refusing the expansion."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client

pytestmark = pytest.mark.integration

DOCUMENT_TYPES = ("Referral", "Insurance card", "Referral", None, "Referral")


@pytest.fixture
def server(fresh_sandbox: SandboxServer) -> SandboxServer:
    return fresh_sandbox


@pytest.fixture
def client(server: SandboxServer) -> Iterator[httpx.Client]:
    with api_client(server) as client:
        yield client


@pytest.fixture
def patients(server: SandboxServer, client: httpx.Client) -> tuple[str, str]:
    """Two patients among the first page: one with five uploaded documents, one with two."""
    rows = server.store.table(cat.PATIENTS.name).rows
    many, few = rows[3]["id"], rows[7]["id"]
    for patient_id, kinds in ((many, DOCUMENT_TYPES), (few, DOCUMENT_TYPES[:2])):
        for n, kind in enumerate(kinds):
            form = {} if kind is None else {"document_type": kind}
            response = client.post(
                f"Patients({patient_id})/Documents",
                files={"file": (f"scan-{n}.pdf", b"%PDF-1.4\n%%EOF\n", "application/pdf")},
                data=form,
            )
            assert response.status_code == 201
    return many, few


def listing(client: httpx.Client, patient_id: str, **params: str) -> dict:
    response = client.get(f"Patients({patient_id})/Documents", params=params)
    assert response.status_code == 200
    return response.json()


def test_collection_expands_documents_and_appointments_with_counts(client, patients):
    body = client.get(
        "Patients",
        params={
            "$top": "100",
            "$orderby": "id",
            "$count": "true",
            "$expand": "Documents($count=true;$select=id,uploaded_at),"
            "Appointments($count=true;$top=5)",
        },
    ).json()
    page = body["value"]
    assert len(page) == 100 and body["@odata.count"] >= 100
    assert {p["id"] for p in page} >= set(patients)
    for patient in page:
        listed = listing(client, patient["id"], **{"$select": "id,uploaded_at", "$count": "true"})
        assert patient["Documents@odata.count"] == listed["@odata.count"]
        assert patient["Documents"] == listed["value"]  # in id order, only the selected fields
        assert len(patient["Appointments"]) == min(5, patient["Appointments@odata.count"])
        assert all(a["patient_id"] == patient["id"] for a in patient["Appointments"])
    by_id = {p["id"]: p for p in page}
    assert by_id[patients[0]]["Documents@odata.count"] >= 5
    assert by_id[patients[1]]["Documents@odata.count"] >= 2


def test_single_patient_expands_documents_with_nested_options(client, patients):
    many = patients[0]
    nested = {
        "$filter": "document_type eq 'Referral'",
        "$orderby": "uploaded_at desc",
        "$top": "2",
        "$skip": "1",
        "$count": "true",
        "$select": "id,document_type,uploaded_at",
    }
    expand = "Documents(" + ";".join(f"{k}={v}" for k, v in nested.items()) + ")"
    body = client.get(f"Patients({many})", params={"$expand": expand}).json()
    listed = listing(client, many, **nested)
    assert body["id"] == many
    assert body["Documents@odata.count"] == listed["@odata.count"] == 3
    assert body["Documents"] == listed["value"]
    assert len(body["Documents"]) == 2
    without_count = client.get(f"Patients({many})", params={"$expand": "Documents"}).json()
    assert "Documents@odata.count" not in without_count
    assert [d["id"] for d in without_count["Documents"]] == [
        d["id"] for d in listing(client, many)["value"]
    ]


def test_documents_expand_under_a_nested_patient(client, server, patients):
    branch = server.store.table(cat.PATIENTS.name).get(patients[0])["primary_branch_id"]
    body = client.get(
        f"Branches({branch})",
        params={"$expand": f"Patients($filter=id eq '{patients[0]}';$expand=Documents)"},
    ).json()
    assert [len(p["Documents"]) for p in body["Patients"]] == [5]


def test_cap_truncates_expanded_collections_and_count_tells_the_full_number(
    client, server, patients
):
    server.configure(expand_cap=2)
    many = patients[0]
    body = client.get(
        "Patients",
        params={
            "$filter": f"id eq '{many}'",
            "$expand": "Documents($count=true),Appointments($count=true;$top=1)",
        },
    ).json()
    patient = body["value"][0]
    assert patient["Documents@odata.count"] == 5
    assert [d["id"] for d in patient["Documents"]] == [
        d["id"] for d in listing(client, many, **{"$top": "2"})["value"]
    ]
    assert len(patient["Appointments"]) <= 1  # a smaller nested $top still wins
    single = client.get(f"Patients({many})", params={"$expand": "Documents"}).json()
    assert len(single["Documents"]) == 2
    assert len(listing(client, many)["value"]) == 5  # the listing endpoint is not capped
    server.configure(expand_cap=None)
    assert (
        len(client.get(f"Patients({many})", params={"$expand": "Documents"}).json()["Documents"])
        == 5
    )


@pytest.mark.parametrize(
    ("path", "expand"),
    [
        ("Patients", "Documents"),
        ("Patients", "Appointments,Documents($select=id)"),
        ("Patients({patient})", "Documents"),
        ("Appointments", "Patients($expand=Documents)"),
    ],
)
def test_refusal_answers_400_with_the_error_body(client, server, patients, path, expand):
    assert server.control().faults(refuse_document_expand=True) == {"refuse_document_expand": True}
    response = client.get(path.format(patient=patients[0]), params={"$expand": expand})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "InvalidQueryOption"
    assert "Documents" in error["message"] and error["details"]
    # Everything else is still served, the per-patient listing included.
    assert client.get("Patients", params={"$expand": "Appointments"}).status_code == 200
    assert listing(client, patients[0], **{"$count": "true"})["@odata.count"] >= 5
    server.control().faults(refuse_document_expand=0)
    assert (
        client.get(path.format(patient=patients[0]), params={"$expand": expand}).status_code == 200
    )


def test_metadata_and_openapi_show_the_contained_navigation(client):
    edmx = client.get("$metadata").text
    assert (
        '<NavigationProperty Name="Documents" Type="Collection(ClinicalRecords.Document)" '
        'ContainsTarget="true"/>'
    ) in edmx
    assert 'NavigationPropertyBinding Path="Documents"' not in edmx
    patient = client.get("openapi.json").json()["components"]["schemas"]["Patient"]
    assert {"Documents", "Documents@odata.count"} <= set(patient["properties"])
    names = {s["name"] for s in client.get("").json()["value"]}
    assert cat.DOCUMENTS.name not in names


@pytest.mark.parametrize(
    ("changes", "ok"),
    [
        ({"expand_cap": 3}, True),
        ({"expand_cap": 0}, True),
        ({"expand_cap": None}, True),
        ({"expand_cap": -1}, False),
        ({"expand_cap": 2.5}, False),
        ({"expand_cap": True}, False),
        ({"refuse_document_expand": True}, True),
        ({"refuse_document_expand": 0}, True),
        ({"refuse_document_expand": 2}, False),
        ({"refuse_document_expand": "yes"}, False),
        ({"refuse_document_expand": None}, False),
    ],
)
def test_switch_values_are_checked(changes, ok):
    config = SandboxConfig()
    if not ok:
        with pytest.raises(ValueError):
            config.update(**changes)
        return
    config.update(**changes)
    name, value = next(iter(changes.items()))
    expected = bool(value) if name == "refuse_document_expand" else value
    assert getattr(config, name) == expected and type(getattr(config, name)) is type(expected)
