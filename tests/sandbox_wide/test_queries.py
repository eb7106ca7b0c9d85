"""The wide profile's awkward keys and values at work: leading-zero twins are two records,
every string key works in a path and in `eq`, number references join the canonical text of
string ids, filters compare as the spec's types say, a value as sent finds its record; drift,
a day of changes and uploads stay wide; the command serves the profile."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.query import quote
from connectors.clinical_records.transport import path_key
from connectors.sandbox import columns, generator
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from connectors.sandbox.store import Store
from tests.conftest import api_client
from tests.sandbox_wide.wide import (
    INSTANT,
    LEADING_ZEROS,
    STRING_KEYED,
    instant,
)
from tests.test_sandbox_cli import served

pytestmark = pytest.mark.integration


def twins(data: dict[str, list[dict]], entity: cat.EntitySet) -> list[tuple[str, str]]:
    """(key with leading zeros, the same number without them), both keys of the set."""
    keys = {row["id"] for row in data[entity.name]}
    return [
        (k, k.lstrip("0"))
        for k in sorted(keys)
        if LEADING_ZEROS.fullmatch(k) and k.lstrip("0") in keys
    ]


@pytest.mark.parametrize("entity", [cat.PATIENTS, cat.PHYSICIANS], ids=lambda e: e.name)
def test_leading_zero_twins_are_two_records_by_key(client, data, entity):
    pairs = twins(data, entity)
    assert pairs
    for zeros, plain in pairs[:10]:
        a = client.get(f"{entity.name}({zeros})").json()
        b = client.get(f"{entity.name}({plain})").json()
        assert (a["id"], b["id"]) == (zeros, plain)
        assert {k: v for k, v in a.items() if k != "id"} != {
            k: v for k, v in b.items() if k != "id"
        }


def test_every_string_key_works_in_a_path_and_in_eq(client, data):
    """One key of each shape per set (quotes, %, #, ?, spaces at the ends, unicode)."""
    for entity in STRING_KEYED:
        by_shape: dict[str, str] = {}
        for row in data[entity.name]:
            shape = re.sub(r"[0-9]+", "9", row["id"])
            by_shape.setdefault(shape, row["id"])
        for key in by_shape.values():
            by_path = client.get(f"{entity.name}({path_key(key)})")
            assert by_path.status_code == 200 and by_path.json()["id"] == key, repr(key)
            found = client.get(entity.name, params={"$filter": f"id eq {quote(key)}"})
            assert [r["id"] for r in found.json()["value"]] == [key], repr(key)
    documents = data[cat.DOCUMENTS.name]
    for doc in documents:
        path = f"Patients({path_key(doc['patient_id'])})/Documents({path_key(doc['id'])})"
        assert client.get(path).json()["id"] == doc["id"]
        assert client.get(f"document/{path_key(doc['id'])}").status_code == 200


def test_number_references_join_the_canonical_text_of_string_ids(client, data):
    patients = {row["id"] for row in data[cat.PATIENTS.name]}
    physicians = {row["id"] for row in data[cat.PHYSICIANS.name]}
    prescriptions = data[cat.PRESCRIPTIONS.name]
    assert all(str(p["patient_id"]) in patients for p in prescriptions)
    for name in ("referring_physician_id", "primary_care_physician_id"):
        assert all(p[name] is None or str(p[name]) in physicians for p in prescriptions)
    zero_twins = {plain for _, plain in twins(data, cat.PATIENTS)}
    joined = [p for p in prescriptions if str(p["patient_id"]) in zero_twins]
    assert joined  # a number whose leading-zero twin exists: it must reach the plain id
    for prescription in joined[:5]:
        expanded = client.get(
            f"Prescriptions({prescription['id']})", params={"$expand": "Patient"}
        ).json()
        assert expanded["Patient"]["id"] == str(prescription["patient_id"])
    numbers = {str(p["id"]) for p in prescriptions}
    texts = [a["prescription_id"] for a in data[cat.APPOINTMENTS.name] if a["prescription_id"]]
    assert texts and all(t in numbers for t in texts)


# -- $filter compares each field in its own spec type -----------------------------------------


def matching(client: httpx.Client, entity: cat.EntitySet, expression: str) -> set:
    rows: list[dict] = []
    while True:
        params = {"$filter": expression, "$orderby": "id", "$skip": str(len(rows))}
        page = client.get(entity.name, params=params)
        assert page.status_code == 200, page.text
        rows += page.json()["value"]
        if len(page.json()["value"]) < 100:
            return {row["id"] for row in rows}


def test_filter_compares_string_fields_as_strings(client, data):
    """Prescriptions.created_at and Appointments.appointment_date are strings in the spec:
    their order is the text's, whatever the text says."""
    for entity, name, bound in (
        (cat.PRESCRIPTIONS, "created_at", "2026-06"),
        (cat.APPOINTMENTS, "appointment_date", "1000"),
        (cat.PATIENTS, "id", "5"),
    ):
        rows = data[entity.name]
        for op, test in (("ge", str.__ge__), ("lt", str.__lt__)):
            expected = {r["id"] for r in rows if r[name] is not None and test(r[name], bound)}
            assert matching(client, entity, f"{name} {op} {quote(bound)}") == expected
            assert expected and expected != {r["id"] for r in rows}


def test_filter_compares_date_times_as_instants_and_decimals_as_numbers(client, data):
    appointments = data[cat.APPOINTMENTS.name]
    texts = [a["start_datetime"] for a in appointments if a["start_datetime"]]
    pivot = sorted(texts, key=instant)[len(texts) // 2]
    when, fraction = instant(pivot)
    utc = when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"
    expected = {
        a["id"]
        for a in appointments
        if a["start_datetime"] and instant(a["start_datetime"]) >= (when, fraction)
    }
    assert matching(client, cat.APPOINTMENTS, f"start_datetime ge {utc}") == expected
    claims = data[cat.CLAIMS.name]
    amount = next(
        c["total_claim_amount"]
        for c in claims
        if c["total_claim_amount"] and len(c["total_claim_amount"].partition(".")[2]) >= 10
    )
    value = Decimal(amount)
    plain = f"{value:f}" if "." in f"{value:f}" else f"{value:f}.0"
    expected = {
        c["id"]
        for c in claims
        if c["total_claim_amount"] and Decimal(c["total_claim_amount"]) == value
    }
    assert matching(client, cat.CLAIMS, f"total_claim_amount eq {plain}") == expected
    nudged = value + Decimal(1).scaleb(-12)
    assert matching(client, cat.CLAIMS, f"total_claim_amount eq {nudged:f}") == set()
    negative = {c["id"] for c in claims if c["id"] < 0}
    assert negative and matching(client, cat.CLAIMS, "id lt 0") == negative


def test_a_value_as_sent_is_a_literal_that_finds_its_record(client, data):
    """A client may filter by a value it read: every date-time form the sandbox sends (`t`,
    `z`, no seconds, nine digits) and every decimal OData writes as a literal (`+12.50`)."""
    appointments = data[cat.APPOINTMENTS.name]
    by_form: dict[str, dict] = {}
    for row in appointments:
        if row["start_datetime"]:
            by_form.setdefault(re.sub(r"[0-9]", "9", row["start_datetime"]), row)
    assert len(by_form) > 20
    for text, row in ((r["start_datetime"], r) for r in by_form.values()):
        same = {
            a["id"]
            for a in appointments
            if a["start_datetime"] and instant(a["start_datetime"]) == instant(text)
        }
        assert row["id"] in same
        assert matching(client, cat.APPOINTMENTS, f"start_datetime eq {text}") == same, text
    claims = data[cat.CLAIMS.name]
    odata_decimal = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")
    amounts = {c["total_claim_amount"] for c in claims if c["total_claim_amount"]}
    literals = sorted(a for a in amounts if odata_decimal.fullmatch(a))
    assert any(a.startswith("+") for a in literals)
    for text in literals[:40]:
        expected = {
            c["id"]
            for c in claims
            if c["total_claim_amount"] and Decimal(c["total_claim_amount"]) == Decimal(text)
        }
        assert matching(client, cat.CLAIMS, f"total_claim_amount eq {text}") == expected, text


# -- determinism, changes, uploads --------------------------------------------------------------


def test_same_seed_same_wide_data_and_wide_is_not_the_default():
    first = generator.generate(3, 0.05, values="wide")
    assert generator.generate(3, 0.05, values="wide") == first
    assert generator.generate(4, 0.05, values="wide") != first
    assert generator.generate(3, 0.05) != first


def test_an_unknown_profile_is_refused_by_name():
    with pytest.raises(ValueError, match="values must be one of spec, wide; got 'narrow'"):
        SandboxConfig(values="narrow")
    with pytest.raises(ValueError, match="values must be one of"):
        Store(scale=0.01, values="narrow")


def test_drift_in_wide_inserts_below_every_key_with_wide_values():
    store = Store(seed=5, scale=0.05, values="wide")
    rng = random.Random(1)
    below: dict[str, list] = {}
    for entity in cat.ENTITY_SETS:
        for _ in range(30):
            lowest = store.table(entity.name).keys[0]
            store.drift(entity, inserts=1, updates=1, deletes=0, rng=rng)
            if store.table(entity.name).keys[0] != lowest:
                below.setdefault(entity.name, []).append(store.table(entity.name).keys[0])
    assert set(below) == {e.name for e in cat.ENTITY_SETS}
    assert any(k < 0 for k in below[cat.CLAIMS.name])  # Int32 keys go below zero
    inserted = [c for c in store.changes if c.kind == "insert"]
    patients = [store.table("Patients").get(c.key) for c in inserted if c.entity == "Patients"]
    names = [p["last_name"] for p in patients if p and p["last_name"]]
    assert any(not n.isascii() or "'" in n or n != n.strip() for n in names)
    updated = [c.key for c in store.changes if c.kind == "update" and c.entity == "Appointments"]
    stamps = [store.table("Appointments").get(k)["updated_at"] for k in updated]
    assert len({INSTANT.fullmatch(s)["offset"] for s in stamps if s}) > 1


def test_a_day_of_changes_in_wide_stays_wide():
    store = Store(seed=5, scale=0.1, values="wide")
    before = set(store.table("Patients").keys)
    store.advance(insert_fraction=0.1, document_fraction=0.5)
    new = set(store.table("Patients").keys) - before
    assert any(not k.isdigit() for k in new) and any(LEADING_ZEROS.fullmatch(k) for k in new)
    documents = store.ground_truth()[cat.DOCUMENTS.name]
    assert len({d["uploaded_at"][-6:] for d in documents}) > 1  # offsets vary


def test_wide_with_resolved_references_resolves_through_changes():
    """Both switches at once: number references still find canonical-text parents when a
    deleted parent's children are moved to a survivor."""
    store = Store(seed=5, scale=0.1, values="wide", resolved_references=True)
    store.advance(delete_fraction=0.05)
    rng = random.Random(2)
    for entity in cat.ENTITY_SETS:
        for _ in range(5):
            store.drift(entity, inserts=1, updates=1, deletes=1, rng=rng)  # never empties a set
    for child, name, parent in sorted(columns.RESOLVED):
        keys = {str(k) for k in store.table(parent).keys}
        sent_values = [row[name] for row in store.table(child).rows]
        assert all(v is not None and str(v) in keys for v in sent_values), (child, name)
    assert any(LEADING_ZEROS.fullmatch(k) for k in store.table("Patients").keys)


def test_uploads_record_the_client_and_generated_documents_a_user_name():
    config = SandboxConfig(seed=5, scale=0.05, values="wide")
    with SandboxServer(config) as server, api_client(server) as client:
        patient = next(k for k in server.store.table("Patients").keys if "'" in k)
        files = {"file": ("a.pdf", b"%PDF-1.4 wide", "application/pdf")}
        response = client.post(f"Patients({path_key(patient)})/Documents", files=files)
        assert response.status_code == 201, response.text
        assert response.json()["uploaded_by_id"] == config.client_id
        generated = [
            d for d in server.store.ground_truth()["Documents"] if d["id"] != response.json()["id"]
        ]
        assert any(re.search(r"[^\W\d_]{3}", d["uploaded_by_id"]) for d in generated)


def test_the_command_serves_the_wide_profile():
    log: list[str] = []
    with served("--values", "wide", log=log) as (env, headers):
        page = httpx.get(f"{env['CLINICAL_API_BASE_URL']}/Patients", headers=headers).json()
        assert any(not row["id"].isdigit() for row in page["value"])
    assert "values wide" in log[0]
