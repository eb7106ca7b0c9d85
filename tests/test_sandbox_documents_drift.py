"""Documents drift (issue 19) over real HTTP: with drift on, requests that list documents
(a patient's listing, or Patients with `$expand=Documents`) also upload documents to random
patients, passed ones included, and delete existing ones; logged, reproducible, and the
ground truth follows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client

pytestmark = pytest.mark.integration

DRIFT = {"drift_every": 2, "drift_inserts": 1, "drift_updates": 0, "drift_deletes": 1}


@pytest.fixture
def server() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=5, scale=0.05, **DRIFT)) as server:
        yield server


def list_every_patient(server: SandboxServer) -> tuple[list[str], list[dict]]:
    """One listing per patient in key order, as a per-patient reader does: the patients
    and the changes drift made meanwhile."""
    patients = [str(k) for k in server.store.table(cat.PATIENTS.name).keys]
    with api_client(server) as client:
        for patient_id in patients:
            assert client.get(f"Patients({patient_id})/Documents").status_code == 200
    return patients, server.control().changes()


def document_changes(changes: list[dict]) -> list[dict]:
    return [c for c in changes if c["entity"] == cat.DOCUMENTS.name]


def test_listing_documents_drifts_them(server: SandboxServer) -> None:
    before = {d["id"] for d in server.control().truth()[cat.DOCUMENTS.name]}
    patients, changes = list_every_patient(server)
    docs = document_changes(changes)
    assert docs and docs == changes  # a listing drifts documents only
    kinds = {c["kind"] for c in docs}
    assert kinds == {"insert", "delete"}
    inserted = {c["key"] for c in docs if c["kind"] == "insert"}
    deleted = {c["key"] for c in docs if c["kind"] == "delete"}
    assert len(inserted) == len(docs) // 2 == len(patients) // 2  # drift every 2nd listing
    truth = server.control().truth()[cat.DOCUMENTS.name]
    now = {d["id"] for d in truth}
    assert now == (before | inserted) - deleted
    # Uploads land on patients the reader had listed already (and are seen only by a re-read).
    owner = {d["id"]: d["patient_id"] for d in truth}
    order = {p: i for i, p in enumerate(patients)}
    uploads = [c["key"] for c in docs if c["kind"] == "insert"]  # the j-th while listing
    passed = [order[owner[k]] < 2 * j + 1 for j, k in enumerate(uploads) if k in owner]
    assert any(passed)  # listing patient 2j + 1 then (drift every 2nd request)
    # Listing now shows the drifted documents (ground truth and service agree).
    with api_client(server) as client:
        server.configure(drift_every=0)
        served = {
            d["id"]
            for p in patients
            for d in client.get(f"Patients({p})/Documents").json()["value"]
        }
    assert served == now


def test_document_drift_is_reproducible_from_the_seed() -> None:
    runs = []
    for _ in range(2):
        with SandboxServer(SandboxConfig(seed=5, scale=0.05, **DRIFT)) as server:
            runs.append(list_every_patient(server)[1])
    assert runs[0] == runs[1] and runs[0]


def test_patients_expanding_documents_drift_them_too(server: SandboxServer) -> None:
    with api_client(server) as client:
        for _ in range(4):
            plain = client.get("Patients", params={"$top": "10"})
            assert plain.status_code == 200
        assert document_changes(server.control().changes()) == []
        for _ in range(4):
            expanded = client.get("Patients", params={"$top": "10", "$expand": "Documents"})
            assert expanded.status_code == 200
    changes = server.control().changes()
    assert {c["entity"] for c in changes} == {cat.PATIENTS.name, cat.DOCUMENTS.name}
    assert len(document_changes(changes)) == 4  # two drifts: an upload and a delete each


def test_documents_stay_still_with_drift_off(fresh_sandbox: SandboxServer) -> None:
    with api_client(fresh_sandbox) as client:
        for patient_id in fresh_sandbox.store.table(cat.PATIENTS.name).keys[:20]:
            client.get(f"Patients({patient_id})/Documents").raise_for_status()
        client.get("Patients", params={"$expand": "Documents"}).raise_for_status()
    assert fresh_sandbox.control().changes() == []


def test_a_day_of_changes_can_move_documents(fresh_sandbox: SandboxServer) -> None:
    """`advance(document_fraction=...)` uploads and deletes documents; without it (the
    default) documents stay as they are and the summary does not name them."""
    control = fresh_sandbox.control()
    before = {d["id"] for d in control.truth()[cat.DOCUMENTS.name]}
    assert cat.DOCUMENTS.name not in control.advance(seconds=3600)
    assert {d["id"] for d in control.truth()[cat.DOCUMENTS.name]} == before
    # A share is a binomial draw: at 1.0 every document goes and as many come, whatever the seed.
    moved = control.advance(seconds=3600, document_fraction=1.0)[cat.DOCUMENTS.name]
    after = {d["id"] for d in control.truth()[cat.DOCUMENTS.name]}
    assert moved["inserted"] == len(after - before) > 0
    assert moved["deleted"] == len(before - after) > 0
