"""The simulation's record of what the service showed: the oracle judges every set against
it, so a look it invents (or misses) is a verdict wrong either way.

Found by seed 5264 (drift aimed at Patients, faults): a listing of a patient's documents
answered 200 with a garbled body was taken as a look showing the patient's document; the
client retried, the patient had been deleted meanwhile (404), the run rightly held no
document, and the oracle called the run silent.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from connectors.clinical_records.catalogue import PATIENTS
from connectors.clinical_records.documents import DocumentsClient
from connectors.clinical_records.errors import RetryExhausted
from connectors.sandbox.store import Change
from tests.simulation.explore import play
from tests.simulation.world import Scenario, World

QUIET = {
    "scale": 0.01,
    "drift_every": 0,
    "drift_only": (),
    "error_rate": 0.0,
    "drop_rate": 0.0,
    "garble_rate": 0.0,
    "throttle_rate": 0.0,
    "token_lifetime": 300.0,
    "kill_at": None,
}


@pytest.fixture
def world():
    made: list[World] = []

    def make(**changes: object) -> World:
        made.append(World(dataclasses.replace(Scenario.of(0), **{**QUIET, **changes})))
        return made[-1]

    yield make
    for one in made:
        one.close()


def _patient_with_documents(world: World) -> str:
    by_patient = world.sandbox.store.documents.by_patient
    return next(p for p, docs in sorted(by_patient.items()) if docs)


def test_a_garbled_answer_is_no_look(world):
    garbled = world(garble_rate=1.0)
    patient = _patient_with_documents(garbled)
    garbled.settings = dataclasses.replace(garbled.settings, max_attempts=2)
    with garbled._client() as client, pytest.raises(RetryExhausted):
        DocumentsClient(client).list(patient)
    assert garbled.service.journal.served == []


def test_a_gone_patients_listing_shows_no_documents(world):
    quiet = world()
    patient = _patient_with_documents(quiet)
    with quiet._client() as client:
        listed = DocumentsClient(client).list(patient)
        assert listed
        store = quiet.sandbox.store
        store.table(PATIENTS.name).delete(patient)
        store.changes.append(Change(PATIENTS.name, "delete", patient, store.now))
        assert next(client.each(DocumentsClient(client).list, [patient])) is None  # 404
    shown, gone = quiet.service.journal.served
    assert shown.patients == gone.patients == {patient}
    assert len(shown.truth.documents[patient]) == len(listed)
    assert gone.status == 404 and patient not in gone.truth.documents


def test_a_seed_replays_whatever_the_process_drew_before():
    """A retry's jitter is the seed's: it moves the simulated clock, and so the token
    expiries, the requests and where the drift falls."""
    random.seed(0)
    first = [str(v) for v in play(5264)[1]]
    random.seed(1)
    assert [str(v) for v in play(5264)[1]] == first
