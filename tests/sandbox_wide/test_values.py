"""The wide profile's values over real HTTP: every value fits the served OpenAPI schema and
`$metadata` types, every set pages once through each key, and each awkward shape the spec's
types allow (strings, keys, numbers, decimals, date-times, dates) is there."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from datetime import date
from decimal import Decimal, localcontext

import httpx
import pytest
from openapi_schema_validator import OAS30Validator, oas30_format_checker

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Edm
from connectors.clinical_records.transport import path_key
from connectors.sandbox.store import Store
from tests.sandbox_wide.wide import (
    CANONICAL,
    DECIMAL,
    INSTANT,
    INT32_MAX,
    INT32_MIN,
    LEADING_ZEROS,
    STRING_KEYED,
    UUID,
    instant,
    values,
)
from tests.truth import sent

pytestmark = pytest.mark.integration

# -- what is sent fits what the sandbox says it sends ----------------------------------------


def test_every_value_validates_against_the_served_openapi(client, data):
    document = client.get("openapi.json").json()
    schemas = document["components"]["schemas"]
    for entity in cat.ALL_ENTITIES:
        schema = {**schemas[entity.type_name], "components": document["components"]}
        validator = OAS30Validator(schema, format_checker=oas30_format_checker)
        for row in data[entity.name]:
            errors = [e.message for e in validator.iter_errors(row)]
            assert not errors, (entity.name, row[entity.key], errors[:3])
    assert data[cat.DOCUMENTS.name]


def metadata_types(client: httpx.Client) -> dict[str, dict[str, dict[str, str]]]:
    """Property attributes per entity type, from the served `$metadata`."""
    root = ET.fromstring(client.get("$metadata").text)
    ns = {"edm": "http://docs.oasis-open.org/odata/ns/edm"}
    return {
        t.get("Name"): {p.get("Name"): p.attrib for p in t.findall("edm:Property", ns)}
        for t in root.iterfind(".//edm:EntityType", ns)
    }


def fits(kind: str, value: object) -> bool:
    """A JSON value in the OData JSON form of an Edm type (spec 2's type notes)."""
    if kind == "Edm.String":
        return type(value) is str
    if kind == "Edm.Int32":
        return type(value) is int and INT32_MIN <= value <= INT32_MAX
    if kind == "Edm.Boolean":
        return type(value) is bool
    if kind == "Edm.Decimal":
        return type(value) is str and DECIMAL.fullmatch(value) is not None
    if kind == "Edm.Date":
        return type(value) is str and len(value) == 10 and bool(date.fromisoformat(value))
    assert kind == "Edm.DateTimeOffset"
    return type(value) is str and bool(instant(value))


def test_every_value_has_its_metadata_type_length_and_nullability(client, data):
    types = metadata_types(client)
    for entity in cat.ALL_ENTITIES:
        properties = types[entity.type_name]
        for row in data[entity.name]:
            assert set(row) == set(properties) - {"@odata.context"}
            for name, attrs in properties.items():
                value = row[name]
                if value is None:
                    assert attrs.get("Nullable") != "false", (entity.name, name)
                    continue
                assert fits(attrs["Type"], value), (entity.name, name, value)
                if "MaxLength" in attrs:
                    assert len(value) <= int(attrs["MaxLength"]), (entity.name, name, value)


def test_every_set_pages_once_through_each_key_in_a_total_order(client, data, wide):
    """Keyset paging over `id` (strings of every shape, Int32s below zero) reads each record
    once, in code point order, and `$skip` paging over `$orderby=id` agrees."""
    truth = wide.store.ground_truth()
    for entity in cat.ENTITY_SETS:
        keys = [row["id"] for row in data[entity.name]]
        assert keys == sorted({r["id"] for r in truth[entity.name]}), entity.name
        skipped = [
            row["id"]
            for skip in range(0, len(keys), 100)
            for row in client.get(
                entity.name, params={"$orderby": "id desc", "$skip": str(skip)}
            ).json()["value"]
        ]
        assert skipped == keys[::-1], entity.name


def test_the_pages_send_exactly_the_ground_truth(client, data, wide):
    """What the truth helpers give is what the API sends: the same JSON values (strings,
    decimal text, ints), and an entity's bytes are the truth record's encoding."""
    truth = sent(wide)
    store = wide.store.ground_truth()
    for entity in cat.ALL_ENTITIES:
        served_rows = {row[entity.key]: row for row in data[entity.name]}
        if entity is not cat.DOCUMENTS:
            assert served_rows == truth[entity.name], entity.name
        else:
            assert served_rows == {k: truth[entity.name][k] for k in served_rows}
        assert {r[entity.key]: r for r in store[entity.name]} == truth[entity.name]
    for row in data[cat.PATIENTS.name][:50]:
        response = client.get(f"Patients({path_key(row['id'])})")
        context = f"{wide.base_url}/$metadata#Patients/$entity"
        body = {"@odata.context": context, **truth[cat.PATIENTS.name][row["id"]]}
        assert (
            response.content == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        )


# -- every shape the spec's types allow is there ---------------------------------------------


def test_strings_come_in_every_shape(data):
    texts = [v for v in values(data, Edm.STRING, keys=False)]
    shapes = {
        "a quote": lambda t: "'" in t,
        "a double quote": lambda t: '"' in t,
        "leading zeros": lambda t: LEADING_ZEROS.fullmatch(t),
        "a UUID": lambda t: UUID.fullmatch(t),
        "30+ digits": lambda t: re.fullmatch(r"[0-9]{30,}", t),
        "letters and digits": lambda t: re.fullmatch(r"[A-Za-z]+[0-9]+[A-Za-z0-9-]*", t),
        "non-ASCII": lambda t: not t.isascii(),
        "beyond the BMP": lambda t: any(ord(c) > 0xFFFF for c in t),
        "a slash": lambda t: "/" in t,
        "a percent sign": lambda t: "%" in t,
        "? or #": lambda t: "?" in t or "#" in t,
        "whitespace at an end": lambda t: t != t.strip(),
        "a line break": lambda t: "\n" in t,
        "the empty string": lambda t: t == "",
        "a name": lambda t: re.fullmatch(r"[^\W\d_]+(['\- ][^\W\d_]+)+", t),
    }
    missing = [name for name, test in shapes.items() if not any(test(t) for t in texts)]
    assert not missing
    at_max = {
        (e.name, f.name)
        for e in cat.ALL_ENTITIES
        for f in e.fields
        if f.max_length and any(len(r[f.name] or "") == f.max_length for r in data[e.name])
    }
    assert len(at_max) >= 20
    required_empty = [
        (e.name, f.name)
        for e in cat.ALL_ENTITIES
        for f in e.fields
        if f.required and f.type is Edm.STRING and any(r[f.name] == "" for r in data[e.name])
    ]
    assert not required_empty


@pytest.mark.parametrize("entity", [*STRING_KEYED, cat.DOCUMENTS], ids=lambda e: e.name)
def test_string_keys_come_in_every_shape_that_a_path_can_carry(data, entity):
    keys = [row["id"] for row in data[entity.name]]
    assert all(type(k) is str and k for k in keys)
    shapes = {
        "canonical digits": lambda k: CANONICAL.fullmatch(k) and not k.startswith("-"),
        "a negative number's text": lambda k: re.fullmatch(r"-[1-9][0-9]*", k),
        "leading zeros": lambda k: LEADING_ZEROS.fullmatch(k),
        "a UUID": lambda k: UUID.fullmatch(k),
        "30+ digits": lambda k: re.fullmatch(r"[0-9]{30,}", k),
        "a code with letters": lambda k: re.fullmatch(r"[A-Za-z0-9]+", k) and not k.isdigit(),
        "non-ASCII": lambda k: not k.isascii(),
        "a quote": lambda k: "'" in k,
        "characters a path must escape": lambda k: any(c in k for c in "%#? &+"),
        "whitespace at an end": lambda k: k != k.strip(),
    }
    if entity in (cat.PATIENTS, cat.PHYSICIANS):  # a number elsewhere points at these
        shapes["a leading-zero twin"] = lambda k: (
            LEADING_ZEROS.fullmatch(k) and k.lstrip("0") in keys
        )
    missing = [name for name, test in shapes.items() if not any(test(k) for k in keys)]
    assert not missing
    # What the spec's bare `/Set(<key>)` cannot carry stays out of keys (wide.py says why).
    assert not [k for k in keys if re.search(r"[/()\x00-\x1f\x7f]", k) or k.startswith("'")]


def test_ids_that_are_numbers_span_int32(data):
    for entity in cat.ENTITY_SETS:
        if entity.key_field.type is Edm.INT32:
            keys = [row["id"] for row in data[entity.name]]
            assert min(keys) < -(2**30) and max(keys) > 2**30, entity.name
    numbers = values(data, Edm.INT32, keys=False)
    assert {INT32_MIN, INT32_MAX, 0} <= set(numbers)


def test_user_ids_are_names_and_branch_ids_may_be_locations(data):
    users = [
        row[f.name]
        for e in cat.ENTITY_SETS
        for f in e.fields
        if f.key == "user" and f.type is Edm.STRING
        for row in data[e.name]
        if row[f.name]
    ]
    assert any(re.search(r"[^\W\d_]{3}", u) for u in users)
    assert any(u.isdigit() for u in users) and any(LEADING_ZEROS.fullmatch(u) for u in users)
    branches = {str(row["id"]) for row in data[cat.BRANCHES.name]}
    sent_branches = [row["branch_id"] for row in data[cat.APPOINTMENTS.name] if row["branch_id"]]
    assert any(b in branches for b in sent_branches)
    assert any(b not in branches and not b.lstrip("-").isdigit() for b in sent_branches)
    optional_references = [
        row[f.name]
        for e in cat.ENTITY_SETS
        for f in e.fields
        if f.key and f.type is Edm.STRING and not f.required
        for row in data[e.name]
    ]
    assert "" in optional_references


def test_decimals_come_in_every_form_of_decimal_text(data):
    texts = values(data, Edm.DECIMAL)
    fractions = [len(t.partition(".")[2]) for t in texts]
    wholes = [len(t.lstrip("+-").partition(".")[0].lstrip("0")) for t in texts]
    assert max(fractions) >= 10 and max(wholes) >= 20
    forms = {
        "+12.50": r"\+[0-9]+\.[0-9]*0",
        "-0.000001": r"-0\.0*[1-9][0-9]*",
        ".5": r"[+-]?\.[0-9]+",
        "5.": r"[+-]?[0-9]+\.",
        "007.5": r"[+-]?00[0-9]*(\.[0-9]*)?",
        "12": r"[0-9]+",
    }
    assert not [
        form for form, shape in forms.items() if not any(re.fullmatch(shape, t) for t in texts)
    ]


def test_claim_amounts_still_add_up_exactly(data):
    """Up to 32 digits: Python's default context (28 digits) would round the sum itself."""
    with localcontext(prec=64):
        for claim in data[cat.CLAIMS.name]:
            total, paid, balance = (
                claim[k] for k in ("total_claim_amount", "total_claim_paid", "total_claim_balance")
            )
            if None not in (total, paid, balance):
                assert Decimal(total) == Decimal(paid) + Decimal(balance)


@pytest.mark.parametrize("seed", [1, 2, 3, 29])
def test_every_decimal_has_at_most_20_integer_and_12_fraction_digits(seed):
    """The profile's promise (docs/sandbox.md), which DECIMAL(38,12) keeps: claims'
    balances and patient amounts too, drawn beside `paid` and added to it, and through a
    day of inserts and updates."""
    store = Store(seed=seed, scale=0.08, values="wide")
    days = [store.ground_truth()]
    with store.lock:
        store.advance(insert_fraction=0.2, update_fraction=0.2)
    days.append(store.ground_truth())
    outside = [
        (e.name, f.name, row[f.name])
        for records in days
        for e in cat.ENTITY_SETS  # documents hold no decimal
        for row in records[e.name]
        for f in e.fields
        if f.type is Edm.DECIMAL
        and row.get(f.name) is not None
        and not within_digits(Decimal(row[f.name]), integer=20, fraction=12)
    ]
    assert not outside, outside[:5]


def within_digits(value: Decimal, *, integer: int, fraction: int) -> bool:
    """Whether `value` (written with any zeros) needs at most so many digits either side."""
    with localcontext(prec=64):
        return abs(value) < Decimal(10) ** integer and value == value.quantize(
            Decimal(10) ** -fraction
        )


def test_date_times_come_in_every_form_iso_8601_and_odata_allow(data):
    texts = values(data, Edm.DATETIME)
    parts = [INSTANT.fullmatch(t) for t in texts]
    offsets = {p["offset"] for p in parts}
    assert {"Z", "z", "+00:00"} <= offsets
    assert any(o[0] == "-" for o in offsets) and any(o.endswith((":30", ":45")) for o in offsets)
    assert {len(p["fraction"] or "") for p in parts} == set(range(10))
    assert any(p["seconds"] is None for p in parts)  # T10:00Z
    assert any("t" in t for t in texts)
    years = {t[:4] for t in texts}
    assert {"0001", "9999"} <= years


def test_dates_and_stated_formats_reach_their_edges(data):
    dates = set(values(data, Edm.DATE))
    assert {"0001-01-01", "9999-12-31"} <= dates and any(d.endswith("02-29") for d in dates)
    appointments = data[cat.APPOINTMENTS.name]
    times = {row[f] for row in appointments for f in ("start_time", "end_time")}
    assert {"00:00:00", "23:59:59", "24:00:00"} <= times
    assert all(re.fullmatch(r"[0-9]{2}:[0-9]{2}:[0-9]{2}", t) for t in times - {None})
    days = {row["appointment_date"] for row in appointments} - {None}
    assert all(re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", d) for d in days)
    assert "0001-01-01" in days


@pytest.mark.parametrize(
    ("entity", "field", "free_text"),
    [
        (cat.PRESCRIPTIONS, "created_at", False),  # the set's cursor always names a moment
        (cat.PRESCRIPTIONS, "delivered_on", True),
        (cat.PATIENTS, "dob", True),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_strings_without_a_stated_format_hold_dates_date_times_and_text(
    data, entity, field, free_text
):
    texts = [row[field] for row in data[entity.name] if row[field]]
    kinds = {
        "date": lambda t: re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", t),
        "no offset": lambda t: re.fullmatch(r"[0-9-]{10}[T ][0-9:.]{8,}", t),
        "an offset": lambda t: INSTANT.fullmatch(t),
    }
    found = {name for name, test in kinds.items() if any(test(t) for t in texts)}
    assert found == set(kinds)
    other = [t for t in texts if not any(test(t) for test in kinds.values())]
    assert bool(other) is free_text


# -- keys over HTTP ---------------------------------------------------------------------------
