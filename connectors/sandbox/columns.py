"""What each column's values look like: the rules by a field's type, key family and name,
the few overrides whose meaning matters, and the awkward values the spec allows (the
generator, connectors/sandbox/generator.py, applies them set by set).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Canonical, Edm, EntitySet, Field
from connectors.sandbox.value_text import (
    decimals,
    hhmmss,
    iso_dates,
    iso_instants,
    pick,
    utc_instants,
)

EPOCH = datetime(2026, 11, 1, tzinfo=UTC)  # the sandbox clock starts here: data is reproducible
HISTORY_SECONDS = 3 * 365 * 86400
NULL_SHARE = 0.08  # optional fields left null
MAX_LENGTH_SHARE = 0.02  # string values padded to exactly their max length
DANGLING_CLAIMS = 0.01  # claims whose prescription does not exist (spec: the source has them)
BULK_EDIT_SIZE = 300  # appointments that share one updated_at

# Key family -> the entity set whose key it is (patient -> Patients, ...), from the catalogue.
HOME: dict[str, EntitySet] = {e.key_field.key: e for e in cat.ENTITY_SETS if e.key_field.key}


def navigation_references() -> frozenset[tuple[str, str, str]]:
    """(set, field, parent set) for every field a catalogue navigation joins on to reach a
    parent: the `remote` of a many-navigation (Appointments.patient_id for
    Patients->Appointments) and the `local` of a single one (Appointments.patient_id for
    Appointments->Patients). Contained Documents are kept by patient, not generated here."""
    found = set()
    for entity in cat.ENTITY_SETS:
        for nav in entity.navigations:
            if nav.contained or nav.target not in cat.BY_NAME:
                continue
            target = cat.BY_NAME[nav.target]
            if nav.many and nav.local == entity.key:
                found.add((target.name, nav.remote, entity.name))
            elif not nav.many and nav.remote == target.key:
                found.add((entity.name, nav.local, target.name))
    return frozenset(found)


# Under `resolved` generation these are never null and always name an existing record.
RESOLVED: frozenset[tuple[str, str, str]] = navigation_references()
RESOLVED_FIELDS: frozenset[tuple[str, str]] = frozenset((s, f) for s, f, _ in RESOLVED)

FIRST_NAMES = [
    "Ana", "Zoë", "José", "Chloé", "Björn", "Nguyễn", "Mary-Jane", "D'Arcy", "Łukasz", "Siobhán",
    "O'Neil", "Renée", "Søren", "Aiyana", "Kwame", "Mei", "Ömer", "Yusuf", "Lars", "Priya",
]  # fmt: skip
LAST_NAMES = [
    "O'Brien", "Smith", "García", "Müller", "D'Angelo-Smith", "Nguyen", "Kowalski", "Øster",
    "van der Berg", "Johnson", "Brown", "St. John", "Ibáñez", "Okafor", 'Quote"Mark', "Lee",
]  # fmt: skip
CITIES = ["Springfield", "Portland", "Saint Paul", "Coeur d'Alene", "Española", "Austin", "Salem"]
STATES = ["CA", "NY", "TX", "OR", "MN", "NM", "ID", "WA", "FL", "IL"]
STREETS = ["Main St", "Oak Ave", "O'Connell Rd", "Calle Ñandú", "Elm St", "2nd Ave", "Route 66"]
WORDS = [
    "patient",
    "reports",
    "improved",
    "mobility",
    "follow-up",
    "in",
    "two",
    "weeks",
    "fitting",
    "adjusted",
    "insurance",
    "pending",
    "signed",
    "copy",
    "on",
    "file",
    "brace",
    "socket",
    "liner",
    "'urgent'",
    "café",
    "naïve",
]
OPEN_VALUES: dict[str, list[str]] = {
    "status": ["Scheduled", "Completed", "Cancelled", "No Show", "Checked In"],
    "visit_type": ["In-Person", "Telehealth"],
    "confirmation_status": ["Confirmed", "Pending", "Declined"],
    "network_type": ["IN", "OUT"],
    "gender": ["female", "male", "other", "unknown"],
    "marital_status": ["single", "married", "divorced", "widowed"],
    "carrier_type": ["Medicare", "Medicaid", "Commercial", "Workers Comp"],
    "category": ["Orthotics", "Prosthetics", "Shoes", "Supplies"],
    "k_level": ["K0", "K1", "K2", "K3", "K4"],
    "user_type": ["Practitioner", "Fitter", "Admin"],
    "preferred_phone": ["cell", "home", "work"],
    "credentials": ["MD", "DO", "DPM", "NP", "PA-C"],
    "timezone": ["America/New_York", "America/Chicago", "America/Los_Angeles"],
    "source_name": ["legacy-emr", "import-2024", "portal"],
}


@dataclass
class Context:
    """What a column rule may use: the random stream, the row count and the sets made so far."""

    rng: np.random.Generator
    n: int
    entity: EntitySet
    made: dict[str, list[dict]]
    ids: list  # this set's keys, already made
    now: float  # epoch seconds of the sandbox clock
    columns: dict[str, list]  # columns of this set made so far (overrides may read them)
    created: np.ndarray  # creation instants (epoch seconds), made first: later times follow it
    resolved: bool = False  # navigation references never null, never dangling
    made_keys: Mapping[str, list] = field(default_factory=dict)  # a set's keys, where kept

    def resolves(self, fld: Field) -> bool:
        return self.resolved and (self.entity.name, fld.name) in RESOLVED_FIELDS

    def keys_of(self, home: EntitySet) -> list:
        """The keys of a set made so far, in its records' order: the store's own list (kept
        beside its rows, `Table.keys`) or read off the records. Drift and a year's days make
        records a few at a time against sets of hundreds of thousands: reading every key off
        every record took most of a day's making. The store's list itself, not a copy: read
        it, never change it (the table bisects it)."""
        kept = self.made_keys.get(home.name)
        return kept if kept is not None else [r[home.key] for r in self.made[home.name]]

    def times(self, start: float | None = None) -> np.ndarray:
        """Epoch seconds between `start` (default: three years ago) and now."""
        lo = self.now - HISTORY_SECONDS if start is None else start
        return self.rng.uniform(lo, self.now, self.n).astype(np.int64)


Column = list
Rule = Callable[[Context, Field], Column]


# -- rules by field ---------------------------------------------------------------------------


def parent_keys(ctx: Context, fld: Field) -> list:
    """The keys of the set a reference names, as that set holds them."""
    assert fld.key is not None
    home = HOME[fld.key]
    if home.name == ctx.entity.name:
        existing = ctx.made.get(home.name) if ctx.resolves(fld) else None
        # A self reference points among the new records, or (resolved, when the set already
        # has records) at one that exists: a new record's serial may yet give way to a key.
        return ctx.keys_of(home) if existing else ctx.ids
    return ctx.keys_of(home)


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
CANONICAL_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,9}")


def joinable(keys: Sequence, fld: Field) -> list:
    """`keys` written as `fld`'s JSON type, only those that stay the same id (spec 2: one id is
    a string in one set, a number in another): a number is its decimal text; a string is a
    number only when it is a number's canonical text, so "00123" never stands for 123."""
    if fld.type is Edm.STRING:
        return [str(k) for k in keys]
    return [
        k if type(k) is int else int(k)
        for k in keys
        if type(k) is int or (CANONICAL_INTEGER.fullmatch(k) and INT32_MIN <= int(k) <= INT32_MAX)
    ]


def reference(ctx: Context, fld: Field) -> Column:
    """Ids of the referenced set (or a plausible pool when the service does not expose it),
    written as this field's own JSON type: the string/number mismatch of the spec."""
    assert fld.key is not None
    if fld.key in HOME:
        parents = joinable(parent_keys(ctx, fld), fld)
        return pick(ctx.rng, parents, ctx.n) if parents else [None] * ctx.n  # all deleted
    pool: list = (
        list(range(1, 400))
        if fld.key in cat.NUMERIC_KEYS
        else [f"{fld.key[:3]}-{i:04d}" for i in range(1, 60)]
    )
    kind = str if fld.type is Edm.STRING else int
    return pick(ctx.rng, [kind(v) for v in pool], ctx.n)


SENTENCE_LENGTHS = [k for k in range(1, 9) for _ in range(64)]


def text_for(ctx: Context, fld: Field) -> Column:
    hinted = next((pool for hint, pool in TEXT_HINTS if hint in fld.name), None)
    if hinted is not None:
        values = pick(ctx.rng, hinted, ctx.n)
    elif ctx.n < len(SENTENCE_LENGTHS):  # a few records (drift): a sentence each
        lengths = ctx.rng.integers(1, 9, ctx.n).tolist()
        values = [" ".join(pick(ctx.rng, WORDS, k)) for k in lengths]
    else:  # a pool of sentences to draw from: many records cost a fixed number of draws
        sentences = [" ".join(pick(ctx.rng, WORDS, k)) for k in SENTENCE_LENGTHS]
        values = pick(ctx.rng, sentences, ctx.n)
    if fld.max_length:  # free text sometimes fills its field exactly, in two-byte letters
        for i in np.flatnonzero(ctx.rng.random(ctx.n) < MAX_LENGTH_SHARE).tolist():
            values[i] = (values[i] + " " + "é" * fld.max_length)[: fld.max_length]
    return values


def phone_numbers(ctx: Context) -> list[str]:
    digits = ctx.rng.integers(2_000_000, 9_999_999, ctx.n)
    return [f"(555) {d // 10000:03d}-{d % 10000:04d}" for d in digits.tolist()]


TEXT_HINTS: list[tuple[str, Sequence[str]]] = [
    ("first_name", FIRST_NAMES),
    ("middle_name", FIRST_NAMES),
    ("nickname", FIRST_NAMES),
    ("last_name", LAST_NAMES),
    ("email", [f"{n.lower()}@example.org" for n in ("ana", "zoe.o'brien", "j.garcia", "lee")]),
    ("city", CITIES),
    ("county", ["Multnomah", "Travis", "Doña Ana", "King"]),
    ("state", STATES),
    ("zipcode", ["97201", "10001-1234", "78701", "55101"]),
    ("country", ["US", "United States", "México"]),
    ("street_address", [f"{n} {s}" for n in (1, 42, 100, 7) for s in STREETS]),
    ("color", ["#1F77B4", "#FF7F0E", "#2CA02C", "#D62728"]),
    ("npi", ["1234567893", "1003000126", "1245319599"]),
    ("code", ["PDX", "NYC", "AUS", "MSP"]),
    ("name", ["Fitting", "Follow-up", "Casting", "Evaluation", "Delivery", "Clinic 'North'"]),
    ("version", ["1", "2", "3", "17"]),
    ("duration", ["15", "30", "45", "60"]),
    ("tax_id", ["12-3456789", "98-7654321"]),
    ("link", ["https://survey.example.org/s?id=1&lang=en"]),
]


def fill(ctx: Context, fld: Field) -> Column:
    """The default value of a field, from its type, key family and name."""
    if fld.key is not None:
        return reference(ctx, fld)
    if fld.name in BY_NAME:
        return BY_NAME[fld.name](ctx, fld)
    if fld.parse_as is not None:
        return PARSED_TEXT[fld.parse_as](ctx)
    if fld.type is Edm.STRING:
        if fld.name in OPEN_VALUES:
            return pick(ctx.rng, OPEN_VALUES[fld.name], ctx.n)
        if fld.name.endswith(("_date", "_on")):
            return iso_dates(ctx.times())
        if "phone" in fld.name or "fax" in fld.name:
            return phone_numbers(ctx)
        if fld.name.endswith(("_id", "id1", "id2", "_number", "upin")):
            return [f"X{v}" for v in ctx.rng.integers(10_000, 99_999, ctx.n).tolist()]
        if fld.name.startswith(("start_time", "end_time")):
            return PARSED_TEXT[Canonical.TIME](ctx)
    return BY_TYPE[fld.type](ctx, fld)


PARSED_TEXT: dict[Canonical, Callable[[Context], Column]] = {
    Canonical.DATE: lambda ctx: iso_dates(ctx.times()),
    Canonical.TIME: lambda ctx: hhmmss(ctx.rng.integers(7 * 3600, 18 * 3600, ctx.n) // 900 * 900),
    Canonical.TIMESTAMPTZ: lambda ctx: utc_instants(ctx.times()),
}

BY_TYPE: dict[Edm, Rule] = {
    Edm.STRING: text_for,
    Edm.INT32: lambda ctx, fld: ctx.rng.integers(1, 100_000, ctx.n).tolist(),
    Edm.DECIMAL: lambda ctx, fld: decimals(ctx.rng, ctx.n, 5000),
    Edm.BOOLEAN: lambda ctx, fld: (ctx.rng.random(ctx.n) < 0.6).tolist(),
    Edm.DATE: lambda ctx, fld: iso_dates(ctx.times()),
    Edm.DATETIME: lambda ctx, fld: iso_instants(ctx.rng, ctx.times()),
}


# -- overrides: the fields whose meaning the data must respect ---------------------------------


def instants_as(fld: Field, rng: np.random.Generator, seconds: np.ndarray) -> list[str]:
    """Seconds written as the field's own kind of time text (a plain string, such as
    Prescriptions.created_at, as fixed-width UTC: text that sorts as its instants do)."""
    if fld.type is Edm.STRING:
        return utc_instants(seconds)
    if fld.type is Edm.DATE:
        return iso_dates(seconds)
    return iso_instants(rng, seconds)


def created_at(ctx: Context, fld: Field) -> Column:
    return instants_as(fld, ctx.rng, ctx.created)


def update_instants(ctx: Context) -> np.ndarray:
    """Some time after creation, mostly in the last two months (epoch seconds)."""
    recent = ctx.rng.uniform(ctx.now - 60 * 86400, ctx.now, ctx.n).astype(np.int64)
    return np.maximum(ctx.created, recent)


def updated_at(ctx: Context, fld: Field) -> Column:
    return instants_as(fld, ctx.rng, update_instants(ctx))


def bulk_edit(ctx: Context, values: Column, write: Callable[[int, int], list[str]]) -> Column:
    """One bulk edit a week ago: hundreds of `values` take its instant, as `write(moment, k)`
    writes it for k rows."""
    bulk = min(BULK_EDIT_SIZE, ctx.n // 4)
    moment = int(ctx.now) - 7 * 86400
    candidates = np.flatnonzero(ctx.created <= moment)
    if bulk and len(candidates) >= bulk:
        shared = write(moment, bulk)
        rows = ctx.rng.choice(candidates, bulk, replace=False).tolist()
        for i, text in zip(rows, shared, strict=True):
            values[i] = text
    return values


def appointment_updated_at(ctx: Context, fld: Field) -> Column:
    """As `updated_at`, and one bulk edit gives hundreds of rows the very same text."""
    return bulk_edit(
        ctx, updated_at(ctx, fld), lambda moment, k: iso_instants(ctx.rng, np.array([moment])) * k
    )


def claim_money(ctx: Context, fld: Field) -> Column:
    """Amount = paid + balance exactly, in cents, so analysts' sums can be checked."""
    if "amounts" not in ctx.columns:
        total = ctx.rng.integers(5_000, 900_000, ctx.n)
        paid = (total * ctx.rng.random(ctx.n)).astype(np.int64)
        pt = (total * ctx.rng.random(ctx.n) * 0.3).astype(np.int64)
        pt_paid = (pt * ctx.rng.random(ctx.n)).astype(np.int64)
        ctx.columns["amounts"] = {
            "total_claim_amount": total,
            "total_claim_paid": paid,
            "total_claim_balance": total - paid,
            "total_pt_responsibility_amount": pt,
            "total_pt_responsibility_paid": pt_paid,
            "total_pt_responsibility_balance": pt - pt_paid,
            "uncollected": (total - paid) // 10,
        }
    cents = ctx.columns["amounts"][fld.name]
    return [f"{c // 100}.{c % 100:02d}" for c in cents.tolist()]


def dangling_prescription(ctx: Context, fld: Field) -> Column:
    values = reference(ctx, fld)
    missing = max(1, round(ctx.n * DANGLING_CLAIMS)) if ctx.n >= 50 else 0
    top = max(ctx.keys_of(cat.PRESCRIPTIONS), default=0)
    picks = ctx.rng.choice(ctx.n, missing, replace=False).tolist()  # drawn either way: the
    if ctx.resolves(fld):  # rest of the data stays the same with or without `resolved`
        return values
    for j, i in enumerate(picks):
        values[i] = top + 1_000_000 + j
    return values


def end_time(ctx: Context, fld: Field) -> Column:
    start = ctx.columns[fld.name.replace("end", "start")]
    minutes = ctx.rng.choice(np.array([15, 30, 45, 60]), ctx.n).tolist()
    out = []
    for s, m in zip(start, minutes, strict=True):
        if s is None:
            out.append(None)
            continue
        h, mm, ss = map(int, s.split(":"))
        total = h * 3600 + mm * 60 + ss + m * 60
        out.append(f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}")
    return out


def birth_dates(ctx: Context, fld: Field) -> Column:
    return iso_dates(ctx.rng.uniform(-40 * 365 * 86400, ctx.now - 18 * 365 * 86400, ctx.n))


BY_NAME: dict[str, Rule] = {"created_at": created_at, "updated_at": updated_at, "dob": birth_dates}

CLAIM_MONEY = (
    "total_claim_amount",
    "total_claim_balance",
    "total_claim_paid",
    "total_pt_responsibility_amount",
    "total_pt_responsibility_balance",
    "total_pt_responsibility_paid",
    "uncollected",
)

OVERRIDES: dict[tuple[str, str], Rule] = {
    ("Appointments", "updated_at"): appointment_updated_at,
    ("Appointments", "end_time"): end_time,
    ("Appointments", "end_time_new"): end_time,
    ("Claims", "prescription_id"): dangling_prescription,
    **{("Claims", name): claim_money for name in CLAIM_MONEY},
}

# Fields that are never null although the spec does not mark them required: the cursors and the
# references the product's joins rely on.
ALWAYS_SET = frozenset({"created_at", "updated_at", "uploaded_at", "prescription_id"})


# -- documents --------------------------------------------------------------------------------


def document_fields(i: int, content_type: str) -> dict[str, str | None]:
    """A generated document's descriptive fields, varied by `i`: a file name of its type,
    numeric uploaders."""
    return {
        "file_name": f"scan-{i}.{cat.ACCEPTED_DOCUMENT_TYPES[content_type].lower()}",
        "document_type": ["Prescription", "Insurance card", None][i % 3],
        "description": None if i % 4 else "Scanned on intake",
        "uploaded_by_id": str(1 + i % 50),
    }
