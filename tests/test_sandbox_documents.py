"""Patient documents in the sandbox over real HTTP (spec 4.3, 4.4, 7 and 8)."""

from __future__ import annotations

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.transport import path_key
from connectors.sandbox.config import VALUE_PROFILES
from tests.conftest import api_client
from tests.sandboxes import serving

pytestmark = pytest.mark.integration

# One small file of each type the spec accepts (section 4.3), keyed by MIME type.
SAMPLES: dict[str, tuple[str, bytes]] = {
    "application/pdf": ("scan.pdf", b"%PDF-1.4\n% sample\n%%EOF\n"),
    "image/png": ("card.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32),
    "image/jpeg": ("photo.jpg", b"\xff\xd8\xff\xe0" + b"\x00" * 32),
    "image/tiff": ("fax.tiff", b"II*\x00" + b"\x00" * 32),
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": (
        "letter.docx",
        b"PK\x03\x04" + b"\x00" * 32,
    ),
}


@pytest.fixture
def client(fresh_sandbox):
    with api_client(fresh_sandbox) as client:
        yield client


@pytest.fixture
def patient_id(fresh_sandbox) -> str:
    return fresh_sandbox.store.table("Patients").rows[0]["id"]


def upload(client: httpx.Client, patient_id: str, mime: str, name: str, data: bytes, **form):
    return client.post(
        f"Patients({patient_id})/Documents", files={"file": (name, data, mime)}, data=form
    )


@pytest.mark.parametrize("mime", sorted(SAMPLES))
def test_each_accepted_type_uploads_and_downloads_unchanged(client, patient_id, mime):
    name, data = SAMPLES[mime]
    response = upload(client, patient_id, mime, name, data, document_type="Referral")
    assert response.status_code == 201
    meta = response.json()
    assert set(meta) == set(cat.DOCUMENTS.by_name)
    assert meta["patient_id"] == patient_id
    assert meta["file_name"] == name
    assert meta["content_type"] == mime
    assert meta["file_size_bytes"] == len(data)
    assert meta["document_type"] == "Referral"

    value = client.get(f"Patients({patient_id})/Documents({meta['id']})/$value")
    assert value.status_code == 200
    assert value.content == data
    assert value.headers["content-type"].split(";")[0] == mime
    direct = client.get(f"document/{meta['id']}")
    assert direct.content == data


def test_unsupported_type_is_400(client, patient_id):
    response = upload(client, patient_id, "text/plain", "notes.txt", b"hello")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "UnsupportedFileType"


def test_missing_file_is_400(client, patient_id):
    response = client.post(
        f"Patients({patient_id})/Documents", data={"description": "no file"}, files={"x": b""}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "MissingField"


def test_over_25_mb_is_413(client, patient_id):
    data = b"%PDF-1.4\n" + b"0" * cat.MAX_UPLOAD_BYTES
    response = upload(client, patient_id, "application/pdf", "big.pdf", data)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PayloadTooLarge"


def test_list_with_query_options_metadata_and_delete(client, patient_id):
    before = client.get(f"Patients({patient_id})/Documents", params={"$count": "true"}).json()
    ids = [
        upload(
            client, patient_id, "application/pdf", f"f{i}.pdf", b"%PDF-1.4 x", document_type=t
        ).json()["id"]
        for i, t in enumerate(["Insurance", "Referral", "Insurance"])
    ]
    listing = client.get(
        f"Patients({patient_id})/Documents",
        params={"$filter": "document_type eq 'Insurance'", "$count": "true", "$select": "id"},
    ).json()
    assert listing["@odata.context"].endswith("#Documents")
    assert {d["id"] for d in listing["value"]} >= {ids[0], ids[2]}
    assert ids[1] not in {d["id"] for d in listing["value"]}

    meta = client.get(f"Patients({patient_id})/Documents({ids[1]})").json()
    assert meta["id"] == ids[1]
    assert meta["@odata.context"].endswith("#Documents/$entity")

    assert client.delete(f"Patients({patient_id})/Documents({ids[1]})").status_code == 204
    for path in (
        f"Patients({patient_id})/Documents({ids[1]})",
        f"Patients({patient_id})/Documents({ids[1]})/$value",
        f"document/{ids[1]}",
    ):
        assert client.get(path).status_code == 404, path
    assert client.delete(f"Patients({patient_id})/Documents({ids[1]})").status_code == 404
    after = client.get(f"Patients({patient_id})/Documents", params={"$count": "true"}).json()
    assert after["@odata.count"] == before["@odata.count"] + 2


def test_unknown_patient_is_404(client):
    response = client.get("Patients(999999999)/Documents")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NotFound"
    refused = upload(client, "999999999", "application/pdf", "a.pdf", b"%PDF")
    assert refused.status_code == 404


def test_direct_download_takes_no_query_parameters(client, patient_id):
    doc = upload(client, patient_id, "application/pdf", "a.pdf", b"%PDF-1.4").json()
    response = client.get(f"document/{doc['id']}", params={"$select": "id"})
    assert response.status_code == 400


def test_documents_cannot_be_patched(client, patient_id):
    doc = upload(client, patient_id, "application/pdf", "a.pdf", b"%PDF-1.4").json()
    response = client.patch(f"Patients({patient_id})/Documents({doc['id']})", json={})
    assert response.status_code == 405


@pytest.mark.parametrize("values", VALUE_PROFILES)
def test_an_upload_records_the_calling_customers_client(values):
    """A sandbox serving several customers records each upload as its caller's, not the
    sandbox's default client."""
    with serving(["north", "south"], scale=0.02, values=values) as server:
        for customer in server.customers:
            patient = str(server.store_of(customer.name).table("Patients").keys[0])
            with api_client(server, customer.name) as client:
                made = upload(client, path_key(patient), "application/pdf", "a.pdf", b"%PDF-1.4")
                assert made.status_code == 201, made.text
                doc = path_key(made.json()["id"])
                stored = client.get(f"Patients({path_key(patient)})/Documents({doc})")
            assert made.json()["uploaded_by_id"] == customer.client_id
            assert stored.json()["uploaded_by_id"] == customer.client_id
