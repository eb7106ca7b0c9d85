"""Ids between the service and the warehouse: one conversion each way, and every crossing
of the engine (held keys, parents, key ranges, document paths) goes through them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import (
    CLAIMS,
    PATIENTS,
    PRESCRIPTIONS,
    Canonical,
    Edm,
    EntitySet,
    Field,
)
from connectors.clinical_records.documents import DocumentsClient
from connectors.clinical_records.keys import entity_key, key_text, to_api
from sync.extract import KeyRange
from sync.state import CommittedState
from sync.strategy import Mode, Plan
from tests.warehouse_records import Harness, record
from warehouse.normalise import normalise

KEY_FIELDS: list[tuple[str, Field]] = [
    (ent.name, fld) for ent in cat.ALL_ENTITIES for fld in ent.fields if fld.key
]


def held(entity: EntitySet, fld: Field, sent: list) -> list:
    """What the warehouse holds for the ids `entity` sent in `fld`: the normaliser's column,
    the one conversion a load makes."""
    records = [record(entity, i + 1, **{fld.name: v}) for i, v in enumerate(sent)]
    return normalise(entity, records).table.column(fld.name).to_pylist()


def test_two_spellings_of_a_number_are_two_ids_and_a_number_is_its_text():
    assert key_text("00123") != key_text("123") == key_text(123) == "123"
    assert [key_text(v) for v in (None, True, 1.5, {}, [])] == [None] * 5
    # In each set's own kind: Patients.id is a string, Prescriptions.id a number.
    assert entity_key(PATIENTS, "00123") == "00123" and entity_key(PATIENTS, 123) == "123"
    assert entity_key(PRESCRIPTIONS, "123") == 123 and entity_key(PRESCRIPTIONS, 123) == 123
    assert entity_key(PRESCRIPTIONS, "N01") is None
    # The warehouse: one type per family.
    assert held(PRESCRIPTIONS, PRESCRIPTIONS.field("patient_id"), [123]) == ["123"]
    assert held(CLAIMS, CLAIMS.key_field, [123]) == [123]
    verifications = cat.INSURANCE_VERIFICATIONS
    number = verifications.field("patient_insurance_id")  # a BIGINT family holds numbers
    assert held(verifications, number, ["123"]) == [None]  # not "123": kept in _extras


def spec_ids(fld: Field) -> st.SearchStrategy[Any]:
    if fld.type is Edm.INT32:
        return st.integers(-(2**31), 2**31 - 1)
    return st.one_of(st.text(max_size=12), st.from_regex(r"0*[0-9]{1,6}", fullmatch=True))


@pytest.mark.parametrize(
    ("entity", "fld"), KEY_FIELDS, ids=[f"{e}.{f.name}" for e, f in KEY_FIELDS]
)
@settings(max_examples=20, deadline=None)  # up to 12 ids each: more than 60 pairs gave
@given(data=st.data())
def test_an_id_goes_to_the_warehouse_and_back_unchanged(entity, fld, data):
    """Warehouse -> API gives back what the set sent, and two ids sent differently stay two."""
    ids = spec_ids(fld).filter(lambda v: v != "" or fld.name != cat.ALL_BY_NAME[entity].key)
    sent = data.draw(st.lists(ids, min_size=2, max_size=12))
    kept = held(cat.ALL_BY_NAME[entity], fld, sent)
    assert [to_api(fld, v) for v in kept] == sent
    assert len(set(kept)) == len(set(sent))


@pytest.mark.parametrize(
    ("entity", "fld"), KEY_FIELDS, ids=[f"{e}.{f.name}" for e, f in KEY_FIELDS]
)
def test_the_normaliser_holds_each_id_as_its_family_says(entity, fld):
    """A BIGINT family holds the number sent; any other family the text (a number's decimal
    text), "00123" and "123" two ids."""
    ent = cat.ALL_BY_NAME[entity]
    sent = [0, 7, -3, 2**31 - 1] if fld.type is Edm.INT32 else ["00123", "123", "", "client-f7"]
    if fld.name == ent.key and fld.type is Edm.STRING:
        sent = [v or "x" for v in sent]  # an empty key names no record
    bigint = fld.canonical is Canonical.BIGINT
    assert held(ent, fld, sent) == [v if bigint else key_text(v) for v in sent]


def test_held_keys_are_the_keys_the_pager_sees(tmp_path):
    """The warehouse holds patient "00123": the reconciler must hold "00123" too, the key
    the pager reads, or it finds "00123" inserted and "123" deleted on every run."""
    h = Harness(tmp_path)
    digits = {f.name: "1" for f in PATIENTS.fields if f.key and f.name != "id"}
    h.sync(PATIENTS, [record(PATIENTS, 1, id=k, **digits) for k in ("00123", "123")])
    h.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, i) for i in (9, 10, 100)])
    h.close()
    with CommittedState(h.path) as committed:
        patients = committed.held_keys(PATIENTS)
        prescriptions = committed.held_keys(PRESCRIPTIONS)
    assert patients == {entity_key(PATIENTS, r) for r in ("00123", "123")} == {"00123", "123"}
    assert prescriptions == {9, 10, 100}  # numbers, as the service sends and orders them


def test_a_key_range_orders_number_keys_as_numbers(tmp_path):
    """The budget's key range starts where the last ended (text in ops.sync_state): "10"
    goes out as 10, and the keys after it are 100 and on, not "100" < "9"."""
    plan = Plan(PRESCRIPTIONS, Mode.RANGE, "test", range_pages=1, range_from="10")
    held = [entity_key(PRESCRIPTIONS, k) for k in ("9", "10", "100", "11")]
    key_range = KeyRange.of(plan, held)
    assert (key_range.low, key_range.high, key_range.held) == (10, None, [10, 11, 100])
    assert key_range.as_text() == ("10", None)


def test_a_document_path_names_the_patient_as_held():
    assert DocumentsClient._path("00123", "d-1") == "Patients(00123)/Documents(d-1)"
    assert DocumentsClient._path("123") == "Patients(123)/Documents"


def test_every_key_family_crosses_sets_without_a_cast():
    """A reference held as text converts to the kind of the set it is sent to."""
    (kept,) = held(cat.APPOINTMENTS, cat.APPOINTMENTS.field("prescription_id"), ["123"])
    assert to_api(PRESCRIPTIONS.key_field, kept) == 123
    (kept,) = held(PRESCRIPTIONS, PRESCRIPTIONS.field("patient_id"), [123])
    assert to_api(PATIENTS.key_field, kept) == "123"
    assert {f.canonical for _, f in KEY_FIELDS if f.key == "patient"} == {Canonical.VARCHAR}
