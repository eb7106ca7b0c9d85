"""The `wide` values profile (issue 29): every field drawn from its spec type alone, not from
the catalogue's key families, so the sandbox can catch a mistake in the catalogue.

What each spec type allows, as this profile reads the spec (docs/sandbox.md):
- Edm.String: text of every shape (names, codes, digits with and without leading zeros,
  UUIDs, 30+ digits, unicode, quotes, characters a URL or an OData literal must escape,
  whitespace at the ends, the empty string where the field is optional), within its max
  length and sometimes exactly at it. Where the spec states a format ("Date, YYYY-MM-DD",
  "Time, HH:MM:SS") that format, edges included (`24:00:00`); where a string means a date or
  time without a stated format (`dob`, `delivered_on`, Prescriptions' `created_at`): dates,
  date-times with and without an offset, and free text.
- String keys: the same shapes, and a key with leading zeros beside the same number without
  them ("00123" and "123": two records). Never `/`, `(`, `)`, a control character, or a
  leading quote: spec 4.2 writes keys bare in `/Set(<key>)`, and those cannot come back
  through that form (a decoded `/` or parenthesis ends the key, a newline ends the path,
  and `'...'` is the quoted key form). Non-key strings carry all of them.
- Edm.Int32: the whole range, keys too (negative ones included).
- Edm.Decimal: decimal text as `openapi.DECIMAL_PATTERN` admits: signs (`+12.50`,
  `-0.000001`), `.5`, `5.`, leading and trailing zeros, up to 20 integer and 12 fraction
  digits (DECIMAL(38,12) holds every one); no exponent.
- Edm.Date: YYYY-MM-DD from 0001-01-01 to 9999-12-31, leap days included (not 0000: a year
  Python's `date`, and so the sandbox's own `$filter`, cannot hold).
- Edm.DateTimeOffset: what ISO 8601 and OData's Edm.DateTimeOffset (the `$metadata` type)
  both allow, as `openapi.DATETIME_PATTERN` describes it: extended format, `T` or `t`, `Z`,
  `z` or `+hh:mm`/`-hh:mm`, seconds optional (`T10:00Z`), 1 to 9 fraction digits. Not a
  space for `T`, nor `-0800` after an extended time: ISO 8601 allows neither (a
  representation is all basic or all extended), nor does OData.

References that join stay joined (`columns.joinable`): a number points at a parent whose id
is that number's canonical text. Shares kept from the default profile: 8% nulls in optional
fields, 1% of claims dangling, cursors and `prescription_id` always set; added: 2% empty
strings in optional string references, and `Appointments.branch_id` holding a location code
("Branch or location") in 10%. The cursors keep their meaning: `created_at` and `updated_at`
are the record's real instants (every form of them, never an earlier one), so a reader
filtering by them still sees every change.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

import numpy as np

from connectors.clinical_records.catalogue import Edm, EntitySet, Field
from connectors.sandbox.columns import (
    CLAIM_MONEY,
    DANGLING_CLAIMS,
    FIRST_NAMES,
    HOME,
    INT32_MAX,
    INT32_MIN,
    LAST_NAMES,
    Column,
    Context,
    Rule,
    joinable,
    parent_keys,
)
from connectors.sandbox.value_text import pick
from connectors.sandbox.wide_moments import (
    OFFSETS,
    appointment_updated_at,
    created_at,
    dates,
    instants,
    moments_in_text,
    offset_text,
    times,
    times_in_text,
    updated_at,
    with_edges,
)

EMPTY_SHARE = 0.02  # optional string references sent as ""
LOCATION_SHARE = 0.10  # Appointments.branch_id naming a location, not a branch
MAX_INTEGER_DIGITS = 20
MAX_FRACTION_DIGITS = 12


# -- keys -------------------------------------------------------------------------------------


def _scrambled(serial: int, bits: int) -> int:
    """A bijection of serials onto 0..2**bits-1: keys unique, not in creation order."""
    return serial * 2654435761 % (1 << bits)


def int32_key(serial: int) -> int:
    """An Int32 key anywhere in the type's range, negatives included."""
    return _scrambled(serial, 32) + INT32_MIN


def _digits(s: int) -> str:
    return str(_scrambled(s, 31))  # an Int32's canonical text: numbers may point at it


def _turn(s: int) -> int:
    """How many times the serials have gone round the shapes: varies a shape's details."""
    return s // len(STRING_KEY_SHAPES)


def _twin(s: int) -> str:
    """Leading zeros before the number of the key just before it ("00123" beside "123")."""
    return "0" * (1 + _turn(s) % 3) + _digits(s - 1)


UNICODE_STEMS = ("Zoë", "患者", "🩺", "e\u0301", "Ｐ", "مريض", "Straße")


STRING_KEY_SHAPES: tuple[Callable[[int], str], ...] = (
    _digits,
    _twin,  # follows _digits: its number exists beside it
    lambda s: str(uuid.UUID(bytes=hashlib.sha256(b"key%d" % s).digest()[:16], version=4)),
    _digits,
    lambda s: f"K{s:x}z",  # a code with letters
    lambda s: f"{_scrambled(s, 64):020d}{s:012d}",  # 32 digits, leading zeros at times
    _digits,
    lambda s: f"{UNICODE_STEMS[s % len(UNICODE_STEMS)]}-{s}",
    lambda s: f"O'Brien-{s}",  # a quote OData doubles in a literal
    lambda s: f"{s} 50% #?&=+;,$@[]\\~",  # what a URL path must percent-encode
    lambda s: (f" {s}", f"{s} ", f"  {s}\u00a0")[_turn(s) % 3],  # whitespace at ends
    lambda s: "-" + _digits(s),  # a negative number's canonical text
)


def string_key(serial: int) -> str:
    return STRING_KEY_SHAPES[serial % len(STRING_KEY_SHAPES)](serial)


def make_ids(entity: EntitySet, start: int, n: int, rng: np.random.Generator) -> list:
    """Keys of every shape the key's spec type allows, unique by serial."""
    serials = range(start, start + n)
    if entity.key_field.type is Edm.INT32:
        return [int32_key(s) for s in serials]
    return [string_key(s) for s in serials]


# -- strings ----------------------------------------------------------------------------------

TEXTS = (
    "O'Brien", "'quoted'", 'say "hi"', "''", "it''s", "D'Angelo-Smith",
    "a/b", "50%", "a?b#c", "x+y=z&w", "(paren)", "semi;colon", "back\\slash", "a b",
    " leading", "trailing ", "\ttab", "line\nbreak", "  both  ", "\u00a0nbsp\u00a0",
    "Zoë", "Nguyễn Thị", "東京都", "مريض", "🩺 clinic", "e\u0301", "Straße", "ǅ", "Ω≈ç√",
    "null", "true", "None", "N/A", "-", "$1,234.50", "1234.5", "0", "007", "00123", "123",
    "AB12", "x-9Z", "K3e8z", "PDX", "In-Person", "Completed", "#1F77B4",
    "https://survey.example.org/s?id=1&lang=en", "(555) 123-4567", "+1 555 123 4567",
)  # fmt: skip
USER_IDS = (
    "jsmith", "mary.o'brien", "Dr. Zoë Müller", "D'Arcy", "admin", "Smith, John", "李医生",
    "renée@example.org", " padded ", "u-7f3a9c", "42", "00042", "7", "007", "1001",
    "5f0c2b8e-8d1e-4c5b-9a57-3f7c7a1e2d4b", "svc:import", "O'Neil (locum)",
)  # fmt: skip
LOCATIONS = ("PDX", "LOC-07", "Main St Clinic", "007", "b-12", "Mobile unit 'East'", "")
FILE_NAMES = (
    "Scan (1).PDF", "résumé 'final'.docx", "x-ray 50%.png", " spaced .jpg", "カルテ.tiff",
    "a/b.pdf", "no extension", "", "scan." + "x" * 200 + ".pdf",
)  # fmt: skip


def _generated_texts(rng: np.random.Generator) -> list[str]:
    """Names, UUIDs and long digit strings, drawn afresh for each column."""
    firsts, lasts = pick(rng, FIRST_NAMES, 8), pick(rng, LAST_NAMES, 8)
    names = [f"{a} {b}" for a, b in zip(firsts, lasts, strict=True)]
    uuids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(4)]
    longs = [
        "".join(map(str, rng.integers(0, 10, k).tolist())) for k in rng.integers(30, 41, 4).tolist()
    ]
    return names + uuids + longs


def text_pool(rng: np.random.Generator, fld: Field, base: Sequence[str] = TEXTS) -> list[str]:
    """What a string field may hold: every shape, cut to its max length, some exactly at it,
    and "" unless the field is required."""
    pool = [*base, *_generated_texts(rng)]
    if fld.max_length:
        limit = fld.max_length
        pool = [v[:limit] for v in pool]
        pool += [("é" * limit), ("9" * limit), ("O'Brien " * limit)[:limit]]
    if not fld.required:
        pool.append("")
    return pool


def strings(ctx: Context, fld: Field) -> Column:
    return pick(ctx.rng, text_pool(ctx.rng, fld), ctx.n)


# -- numbers and decimals ---------------------------------------------------------------------

INT32_EDGES = (INT32_MIN, -1, 0, 1, INT32_MAX)


def integers(ctx: Context, fld: Field) -> Column:
    """Small counts, anything in Int32's range, and its edges."""
    kind = ctx.rng.choice(3, ctx.n, p=[0.5, 0.45, 0.05])
    small = ctx.rng.integers(0, 1000, ctx.n)
    whole = ctx.rng.integers(INT32_MIN, INT32_MAX, ctx.n, endpoint=True)
    edges = ctx.rng.choice(np.array(INT32_EDGES, dtype=np.int64), ctx.n)
    return np.choose(kind, [small, whole, edges]).tolist()


DECIMAL_STYLES = ("plain", "plain", "plus", "bare_point", "trailing_point", "zeros", "padded")


def decimal_text(units: int, scale: int, style: str) -> str:
    """`units / 10**scale` as decimal text in one of its written forms, the value unchanged."""
    sign = "-" if units < 0 else ""
    whole, fraction = divmod(abs(units), 10**scale)
    digits = f"{whole}.{fraction:0{scale}d}" if scale else str(whole)
    if style == "plus" and not sign:
        return "+" + digits
    if style == "bare_point" and whole == 0 and scale:
        return sign + digits[1:]  # ".5"
    if style == "trailing_point" and not scale:
        return sign + digits + "."  # "5."
    if style == "zeros":
        return sign + "00" + digits
    if style == "padded" and scale:
        return sign + digits + "00"
    return sign + digits


def _random_units(
    rng: np.random.Generator, n: int, scales: list[int] | None = None
) -> tuple[list[int], list[int]]:
    """`n` unsigned integers of up to MAX_INTEGER_DIGITS + scale digits, and their scales
    (drawn, unless `scales` gives them: amounts that are added up share one)."""
    whole_digits = rng.choice(
        MAX_INTEGER_DIGITS + 1, n, p=_weights(MAX_INTEGER_DIGITS + 1, favour=range(1, 6))
    )
    if scales is None:
        scales = rng.integers(0, MAX_FRACTION_DIGITS + 1, n).tolist()
    table = rng.integers(0, 10, (n, MAX_INTEGER_DIGITS + MAX_FRACTION_DIGITS)).tolist()
    units = [
        int("".join(map(str, row[: k + s])) or "0")
        for row, k, s in zip(table, whole_digits.tolist(), scales, strict=True)
    ]
    return units, scales


def _weights(size: int, favour: range) -> list[float]:
    raw = [8.0 if i in favour else 1.0 for i in range(size)]
    return [w / sum(raw) for w in raw]


DECIMAL_EDGES = (
    "+12.50", "-0.000001", ".5", "5.", "-.25", "0.0000000001", "-0.00", "0",
    "99999999999999999999.999999999999", "-12345678901234567890.123456789012",
)  # fmt: skip


def decimals(ctx: Context, fld: Field) -> Column:
    units, scales = _random_units(ctx.rng, ctx.n)
    signs = ctx.rng.random(ctx.n) < 0.15
    styles = pick(ctx.rng, DECIMAL_STYLES, ctx.n)
    values = [
        decimal_text(-u if negative else u, s, style)
        for u, s, negative, style in zip(units, scales, signs.tolist(), styles, strict=True)
    ]
    return with_edges(ctx, values, DECIMAL_EDGES)


def claim_money(ctx: Context, fld: Field) -> Column:
    """Amount = paid + balance exactly, at up to twelve fraction digits and twenty integer
    ones, each written in its own form: a sum that only exact decimals keep. A claim's
    amounts share one scale, and a balance is cut where the sum would need a 21st digit."""
    if "wide_amounts" not in ctx.columns:
        paid, scales = _random_units(ctx.rng, ctx.n)
        balance = _summand(paid, _random_units(ctx.rng, ctx.n, scales)[0], scales)
        overpaid = ctx.rng.random(ctx.n) < 0.05
        balance = [-b if o else b for b, o in zip(balance, overpaid.tolist(), strict=True)]
        pt_paid, _ = _random_units(ctx.rng, ctx.n, scales)
        pt_balance = _summand(pt_paid, _random_units(ctx.rng, ctx.n, scales)[0], scales)
        uncollected, _ = _random_units(ctx.rng, ctx.n, scales)
        ctx.columns["wide_amounts"] = {
            "scale": scales,
            "total_claim_paid": paid,
            "total_claim_balance": balance,
            "total_claim_amount": [p + b for p, b in zip(paid, balance, strict=True)],
            "total_pt_responsibility_paid": pt_paid,
            "total_pt_responsibility_balance": pt_balance,
            "total_pt_responsibility_amount": [
                p + b for p, b in zip(pt_paid, pt_balance, strict=True)
            ],
            "uncollected": uncollected,
        }
    amounts = ctx.columns["wide_amounts"]
    styles = pick(ctx.rng, DECIMAL_STYLES, ctx.n)
    return [
        decimal_text(units, scale, style)
        for units, scale, style in zip(amounts[fld.name], amounts["scale"], styles, strict=True)
    ]


def _summand(paid: list[int], other: list[int], scales: list[int]) -> list[int]:
    """`other`, each cut to what `paid` leaves below 10**MAX_INTEGER_DIGITS (at its scale),
    so that paid + other has at most MAX_INTEGER_DIGITS integer digits too."""
    return [
        min(o, 10 ** (MAX_INTEGER_DIGITS + s) - 1 - p)
        for p, o, s in zip(paid, other, scales, strict=True)
    ]


# -- references -------------------------------------------------------------------------------

OTHER_STRING_IDS = [string_key(s) for s in range(1, 97)]
OTHER_INT32_IDS = [int32_key(s) for s in range(1, 400)] + list(INT32_EDGES)


def reference(ctx: Context, fld: Field) -> Column:
    """A parent's key as this field's type (`joinable`); where the spec exposes no parent set,
    ids of every shape (user ids are names). Optional string references are "" at times."""
    assert fld.key is not None
    if fld.key in HOME:
        pool = joinable(parent_keys(ctx, fld), fld) or [None]
    elif fld.type is Edm.INT32:
        pool = OTHER_INT32_IDS
    else:
        pool = list(USER_IDS) if fld.key == "user" else OTHER_STRING_IDS
    values = pick(ctx.rng, pool, ctx.n)
    empty = ctx.rng.random(ctx.n) < EMPTY_SHARE
    if fld.type is Edm.STRING and not fld.required and not ctx.resolves(fld):
        for i in np.flatnonzero(empty).tolist():
            values[i] = ""
    return values


def branch_or_location(ctx: Context, fld: Field) -> Column:
    """Appointments.branch_id, "Branch or location": a branch's id or a location's code."""
    values = reference(ctx, fld)
    codes = pick(ctx.rng, LOCATIONS, ctx.n)
    located = ctx.rng.random(ctx.n) < LOCATION_SHARE
    if not ctx.resolves(fld):
        for i in np.flatnonzero(located).tolist():
            values[i] = codes[i]
    return values


def dangling_prescription(ctx: Context, fld: Field) -> Column:
    """As in the default profile, 1% of claims name a prescription that never existed."""
    values = reference(ctx, fld)
    missing = max(1, round(ctx.n * DANGLING_CLAIMS)) if ctx.n >= 50 else 0
    picks = ctx.rng.choice(ctx.n, missing, replace=False).tolist()
    if ctx.resolves(fld):
        return values
    for j, i in enumerate(picks):
        values[i] = int32_key(10**9 + j)  # a serial no insert reaches: no such prescription
    return values


# -- the rules --------------------------------------------------------------------------------

STATED_FORMATS: dict[str, Rule] = {"YYYY-MM-DD": dates, "HH:MM:SS": times}
MOMENT_NAMES = ("_date", "_on", "_at")

BY_TYPE: dict[Edm, Rule] = {
    Edm.STRING: strings,
    Edm.INT32: integers,
    Edm.DECIMAL: decimals,
    Edm.BOOLEAN: lambda ctx, fld: (ctx.rng.random(ctx.n) < 0.6).tolist(),
    Edm.DATE: dates,
    Edm.DATETIME: instants,
}


def fill(ctx: Context, fld: Field) -> Column:
    """A field's values from its spec type and meaning alone."""
    if fld.key is not None:
        return reference(ctx, fld)
    if fld.name in CURSORS:
        return CURSORS[fld.name](ctx, fld)
    if fld.type is Edm.STRING:
        stated = next((rule for form, rule in STATED_FORMATS.items() if form in fld.meaning), None)
        if stated is not None:
            return stated(ctx, fld)
        if fld.name == "dob" or fld.name.endswith(MOMENT_NAMES):
            return moments_in_text(ctx, fld)
        if "_time" in fld.name:
            return times_in_text(ctx, fld)
    return BY_TYPE[fld.type](ctx, fld)


CURSORS: dict[str, Rule] = {"created_at": created_at, "updated_at": updated_at}

OVERRIDES: dict[tuple[str, str], Rule] = {
    ("Appointments", "updated_at"): appointment_updated_at,
    ("Appointments", "branch_id"): branch_or_location,
    ("Claims", "prescription_id"): dangling_prescription,
    **{("Claims", name): claim_money for name in CLAIM_MONEY},
}


# -- documents --------------------------------------------------------------------------------


def document_fields(i: int, content_type: str) -> dict[str, str | None]:
    """A generated document's descriptive fields, varied by `i` (file names of every shape,
    whatever the type): user-name uploaders."""
    return {
        "file_name": FILE_NAMES[i % len(FILE_NAMES)],
        "document_type": (TEXTS[i % len(TEXTS)], "", None)[i % 3],
        "description": (TEXTS[i * 7 % len(TEXTS)], None, "", None)[i % 4],
        "uploaded_by_id": USER_IDS[i % len(USER_IDS)],
    }


def document_id(patient_id: str, serial: int) -> str:
    return string_key(serial)


def upload_stamp(moment: datetime, serial: int) -> str:
    """The upload instant (microseconds kept) with an offset and 6 to 9 fraction digits."""
    offset = int(OFFSETS[serial % len(OFFSETS)])
    seconds = int(moment.timestamp())
    local = np.datetime64(seconds + offset, "s").astype(str)
    fraction = f"{moment.microsecond:06d}" + "0" * (serial % 4)
    separator = "t" if serial % 10 == 3 else "T"
    return f"{local[:10]}{separator}{local[11:]}.{fraction}{offset_text(offset, serial % 3)}"
