"""The sandbox's wide values profile (issue 29): over real HTTP, every value it sends fits the
sandbox's own OpenAPI schema and `$metadata` types, each awkward shape the spec's types allow
is there, awkward keys work in paths, filters and keyset paging, number references join the
canonical text of string ids, and drift and uploads stay wide. The checks here are written
from the spec, not from connectors/sandbox/wide.py, so a profile that narrows fails them."""

from __future__ import annotations

import json
import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, localcontext

import httpx
import pytest
from openapi_schema_validator import OAS30Validator, oas30_format_checker

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Edm
from connectors.clinical_records.query import quote
from connectors.clinical_records.transport import path_key
from connectors.sandbox import columns, generator
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from connectors.sandbox.store import Store
from tests.conftest import api_client
from tests.test_sandbox_cli import served
from tests.truth import sent

pytestmark = pytest.mark.integration

SCALE = 0.2
STRING_KEYED = [e for e in cat.ENTITY_SETS if e.key_field.type is Edm.STRING]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# The spec's forms, written here from the spec (section 2 type notes) and OData's JSON format,
# independently of the generator.
DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")
INSTANT = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?P<hm>[0-9]{2}:[0-9]{2})"
    r"(?P<seconds>:[0-9]{2}(?:\.(?P<fraction>[0-9]{1,12}))?)?"
    r"(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LEADING_ZEROS = re.compile(r"0+[1-9][0-9]*")
CANONICAL = re.compile(r"0|-?[1-9][0-9]*")


def instant(text: str) -> tuple[datetime, str]:
    """An Edm.DateTimeOffset as (UTC second, fraction digits): exact, comparable."""
    match = INSTANT.fullmatch(text)
    assert match, text
    local = datetime.fromisoformat(f"{match['date']}T{match['hm']}{(match['seconds'] or '')[:3]}")
    offset = match["offset"].upper()
    shift = timedelta(0)
    if offset != "Z":
        sign = 1 if offset[0] == "+" else -1
        shift = sign * timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6]))
    return (local - shift).replace(tzinfo=UTC), (match["fraction"] or "").rstrip("0")


# -- a wide sandbox, read whole over HTTP ----------------------------------------------------


@pytest.fixture(scope="module")
def wide() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=13, scale=SCALE, values="wide")) as server:
        yield server


@pytest.fixture(scope="module")
def client(wide: SandboxServer) -> Iterator[httpx.Client]:
    with api_client(wide) as c:
        yield c


def keyset(client: httpx.Client, entity: cat.EntitySet) -> list[dict]:
    """Every record of a set by `$orderby=id` and `id gt <last>`, as a client pages it."""
    rows: list[dict] = []
    while True:
        params = {"$orderby": "id", "$top": "100"}
        if rows:
            params["$filter"] = f"id gt {literal(entity, rows[-1]['id'])}"
        page = client.get(entity.name, params=params)
        assert page.status_code == 200, page.text
        rows += page.json()["value"]
        if len(page.json()["value"]) < 100:
            return rows


def literal(entity: cat.EntitySet, key: object) -> str:
    return quote(key) if entity.key_field.type is Edm.STRING else str(key)


@pytest.fixture(scope="module")
def data(client: httpx.Client, wide: SandboxServer) -> dict[str, list[dict]]:
    """Every set as served, and every document of every patient that has one."""
    read = {e.name: keyset(client, e) for e in cat.ENTITY_SETS}
    owners = {d["patient_id"] for d in wide.store.ground_truth()[cat.DOCUMENTS.name]}
    read[cat.DOCUMENTS.name] = [
        d
        for patient in sorted(owners)
        for d in client.get(f"Patients({path_key(patient)})/Documents").json()["value"]
    ]
    return read


def values(data: dict[str, list[dict]], kind: Edm | None = None, keys: bool = True) -> list:
    """Every non-null value of every field (of one Edm type) across all sets."""
    return [
        row[f.name]
        for e in cat.ALL_ENTITIES
        for row in data[e.name]
        for f in e.fields
        if (kind is None or f.type is kind)
        and (keys or f.name != e.key)
        and row.get(f.name) is not None
    ]


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
