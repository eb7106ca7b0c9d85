"""JSON records -> a canonical Arrow table, column by column with pyarrow compute.

The volume is in the rows, so nothing loops per value on the happy path: the records become
one Arrow struct array in C++, each column is checked with regular expressions and cast, and
failing rows are found with masks. Python touches single values only for the rare column
whose JSON kinds are mixed, for unknown members and for the rows that are rejected.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.clinical_records.catalogue import (
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    Canonical,
    EntitySet,
    Field,
)
from warehouse.schema import ARROW_BY_CANONICAL, EXTRAS, arrow_schema, json_struct_type

log = logging.getLogger(__name__)

REJECT = "reject"
WARNING = "warning"


@dataclass(frozen=True)
class Reject:
    """A row that could not be normalised (kind "reject") or was kept with a note ("warning")."""

    entity: str
    key: str | None
    kind: str
    fields: tuple[str, ...]
    reason: str
    raw_json: str


@dataclass
class NormalisedBatch:
    table: pa.Table
    rejects: list[Reject] = field(default_factory=list)
    unknown_fields: set[str] = field(default_factory=set)

    @property
    def errors(self) -> list[Reject]:
        return [r for r in self.rejects if r.kind == REJECT]

    @property
    def warnings(self) -> list[Reject]:
        return [r for r in self.rejects if r.kind == WARNING]


@dataclass
class Converted:
    """A column in its canonical type plus the rows that failed, each with a reason."""

    values: pa.Array
    errors: list[tuple[np.ndarray, str]] = field(default_factory=list)
    warnings: list[tuple[np.ndarray, str]] = field(default_factory=list)


# The JSON kinds each canonical type accepts (a key sent as a number or as "123" alike).
KIND_BY_TYPE: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    dict: "object",
    list: "array",
}
ACCEPTED_KINDS: dict[Canonical, frozenset[str]] = {
    Canonical.VARCHAR: frozenset({"string", "integer"}),
    Canonical.BIGINT: frozenset({"string", "integer"}),
    Canonical.DECIMAL: frozenset({"string", "integer", "number"}),
    Canonical.BOOLEAN: frozenset({"boolean"}),
    Canonical.DATE: frozenset({"string"}),
    Canonical.TIMESTAMPTZ: frozenset({"string"}),
    Canonical.TIME: frozenset({"string"}),
}
TEXT_BY_KIND: dict[str, Callable[[object], object]] = {
    "string": lambda v: v,
    "integer": str,
    "number": repr,
    "boolean": lambda v: v,  # stays a bool: the only kind BOOLEAN accepts
}

# Up to BIGINT's 19 digits, leading zeros aside; the cast finds what overflows.
INTEGER_RE = r"^-?0*[0-9]{1,19}$"
NUMBER_RE = r"^-?[0-9]+(\.[0-9]+)?$"
_INT_DIGITS = DECIMAL_PRECISION - DECIMAL_SCALE
# Leading zeros and trailing fractional zeros lose nothing; any other digit beyond
# DECIMAL(18,4) would, so such a value is a reject.
DECIMAL_FITS_RE = rf"^-?0*[0-9]{{1,{_INT_DIGITS}}}(\.[0-9]{{0,{DECIMAL_SCALE}}}0*)?$"
DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
DATETIME_RE = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?"
    r"([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)?$"
)
_PLAIN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]FRACTION)?(Z|[+-][0-9]{2}:[0-9]{2})$"
PLAIN_DATETIME_RE = _PLAIN.replace("FRACTION", "{1,6}")
FINE_DATETIME_RE = _PLAIN.replace("FRACTION", "+")  # finer than microseconds: .NET writes 7
OFFSET_RE = r"([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$"
TIME_RE = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$"


def _mask(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _failing(arr: pa.Array, pattern: str) -> pa.Array:
    """True where a non-null value does not match `pattern`."""
    return pc.and_(arr.is_valid(), pc.invert(pc.match_substring_regex(arr, pattern)))


def _null_where(arr: pa.Array, bad: pa.Array) -> pa.Array:
    return pc.if_else(bad, pa.scalar(None, arr.type), arr)


def _cast_each(arr: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Cast, and when one value spoils the whole cast, find it value by value (rare path).
    The values stay in Arrow: a Python object cannot hold every value Arrow can (year 0)."""
    try:
        return pc.cast(arr, target), np.zeros(len(arr), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pieces, bad = [], np.zeros(len(arr), dtype=bool)
        for i in range(len(arr)):
            try:
                pieces.append(pc.cast(arr.slice(i, 1), target))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pieces.append(pa.nulls(1, target))
                bad[i] = arr[i].is_valid
        return pa.concat_arrays(pieces), bad


def to_varchar(arr: pa.Array, fld: Field) -> Converted:
    values = arr if arr.type == pa.string() else pc.cast(arr, pa.string())
    result = Converted(values)
    if fld.max_length is not None:
        too_long = _mask(pc.greater(pc.utf8_length(values), fld.max_length))
        note = f"longer than the spec's max length {fld.max_length}; kept in full"
        result.warnings.append((too_long, note))
    return result


def _any_hex(arr: pa.Array) -> bool:
    prefixed = pc.or_(pc.starts_with(arr, "0x"), pc.starts_with(arr, "0X"))
    return pc.any(prefixed).as_py() is True


def to_bigint(arr: pa.Array, fld: Field) -> Converted:
    if arr.type == pa.int64():
        return Converted(arr)
    # Arrow's cast reads what INTEGER_RE accepts within BIGINT's range, and 0x-hexadecimal,
    # which no JSON integer is: when the whole column casts and nothing is hexadecimal, the
    # regular expression (six times the cost of the cast) has nothing to find.
    values = _cast_whole(arr, pa.int64())
    if values is not None and not _any_hex(arr):
        return Converted(values)
    bad = _failing(arr, INTEGER_RE)
    values, overflow = _cast_each(_null_where(arr, bad), pa.int64())
    return Converted(values, [(_mask(bad) | overflow, "not an integer within BIGINT's range")])


def to_decimal(arr: pa.Array, fld: Field) -> Converted:
    target = ARROW_BY_CANONICAL[Canonical.DECIMAL]
    not_number = _failing(arr, NUMBER_RE)
    loses = pc.and_(pc.invert(not_number), _failing(arr, DECIMAL_FITS_RE))
    bad = pc.or_(not_number, loses)
    values, cast_bad = _cast_each(_null_where(arr, bad), target)
    lossy = f"would lose digits in DECIMAL({DECIMAL_PRECISION},{DECIMAL_SCALE})"
    return Converted(
        values,
        [
            (_mask(not_number), "not a decimal number"),
            (_mask(loses) | cast_bad, lossy),
        ],
    )


def to_boolean(arr: pa.Array, fld: Field) -> Converted:
    return Converted(arr if arr.type == pa.bool_() else pc.cast(arr, pa.bool_()))


def _in_years(converted: Converted) -> Converted:
    """Dates and times outside the years 0001-9999 (in UTC) are rejects: Python's `date`
    and `datetime`, and so most analysts' clients, cannot read them."""
    year = pc.year(converted.values)
    outside = pc.or_(pc.less(year, 1), pc.greater(year, 9999))
    converted.values = _null_where(converted.values, outside)
    converted.errors.append((_mask(outside), "outside the years 0001-9999"))
    return converted


def _cast_whole(arr: pa.Array, target: pa.DataType) -> pa.Array | None:
    """The whole column cast at once, or None when some value does not parse."""
    try:
        return pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def to_date(arr: pa.Array, fld: Field) -> Converted:
    shape = _failing(arr, DATE_RE)
    text = _null_where(arr, shape)
    shape_error = (_mask(shape), "not a date YYYY-MM-DD")
    # Arrow's own date parser refuses 2026-02-30 and month 13, so when it reads the whole
    # column every date is a calendar date: the costly round trip below is for the rest.
    values = _cast_whole(text, pa.date32())
    if values is not None:
        return _in_years(Converted(values, [shape_error]))
    parsed = pc.strptime(text, "%Y-%m-%d", "s", error_is_null=True)
    # strptime rolls 2026-02-30 over to March: a round trip finds impossible dates.
    # A value strptime cannot read at all (month 13) is null there: also impossible.
    round_trips = pc.fill_null(pc.equal(pc.strftime(parsed, "%Y-%m-%d"), text), False)
    impossible = pc.and_(text.is_valid(), pc.invert(round_trips))
    values = pc.cast(_null_where(parsed, impossible), pa.date32())
    return _in_years(Converted(values, [shape_error, (_mask(impossible), "not a calendar date")]))


def _cut_fraction(text: pa.Array) -> pa.Array:
    """Microseconds are the warehouse's precision; .NET-style 7-digit fractions are cut."""
    return pc.replace_substring_regex(text, r"(\.[0-9]{6})[0-9]+", r"\1")


def to_timestamptz(arr: pa.Array, fld: Field) -> Converted:
    target = ARROW_BY_CANONICAL[Canonical.TIMESTAMPTZ]
    # The common shapes (seconds, a fraction, Z or +HH:MM) need no rewriting but a fraction
    # cut to microseconds: a pattern or two and one cast, unless some value differs or does
    # not parse. (A cast that fails costs about 25 times one that succeeds.)
    plain = None
    if not pc.any(_failing(arr, PLAIN_DATETIME_RE)).as_py():
        plain = arr
    elif not pc.any(_failing(arr, FINE_DATETIME_RE)).as_py():
        plain = _cut_fraction(arr)
    values = _cast_whole(plain, target) if plain is not None else None
    if values is not None:
        return _in_years(Converted(values))
    shape = _failing(arr, DATETIME_RE)
    text = _null_where(arr, shape)
    text = pc.replace_substring_regex(_cut_fraction(text), "z$", "Z")  # Arrow reads only Z
    # A date-time without an offset is taken as UTC (the spec promises an offset or Z).
    has_offset = pc.match_substring_regex(text, OFFSET_RE)
    text = pc.if_else(has_offset, text, pc.binary_join_element_wise(text, "Z", ""))
    values, impossible = _cast_each(text, target)
    return _in_years(
        Converted(
            values,
            [(_mask(shape), "not an ISO 8601 date-time"), (impossible, "not a valid date-time")],
        )
    )


def to_time(arr: pa.Array, fld: Field) -> Converted:
    bad = _failing(arr, TIME_RE)
    text = _null_where(arr, bad)

    def part(start: int) -> pa.Array:
        return pc.cast(pc.utf8_slice_codeunits(text, start, start + 2), pa.int64())

    seconds = pc.add(pc.add(pc.multiply(part(0), 3600), pc.multiply(part(3), 60)), part(6))
    micros = pc.multiply(seconds, 1_000_000)
    return Converted(micros.view(pa.time64("us")), [(_mask(bad), "not a time HH:MM:SS")])


CONVERTERS: dict[Canonical, Callable[[pa.Array, Field], Converted]] = {
    Canonical.VARCHAR: to_varchar,
    Canonical.BIGINT: to_bigint,
    Canonical.DECIMAL: to_decimal,
    Canonical.BOOLEAN: to_boolean,
    Canonical.DATE: to_date,
    Canonical.TIMESTAMPTZ: to_timestamptz,
    Canonical.TIME: to_time,
}


def _loose_column(
    records: Sequence[dict], fld: Field
) -> tuple[pa.Array, list[tuple[np.ndarray, str]]]:
    """A column whose JSON kinds are mixed: accepted kinds as text, the others rejected."""
    accepted = ACCEPTED_KINDS[fld.canonical]
    out: list[object] = []
    wrong: dict[str, np.ndarray] = {}
    for i, record in enumerate(records):
        value = record.get(fld.name)
        kind = KIND_BY_TYPE.get(type(value), "other") if value is not None else None
        if kind is None or kind in accepted:
            out.append(None if kind is None else TEXT_BY_KIND[kind](value))
            continue
        wrong.setdefault(kind, np.zeros(len(records), dtype=bool))[i] = True
        out.append(None)
    arrow_type = pa.bool_() if fld.canonical is Canonical.BOOLEAN else pa.string()
    expected = " or ".join(sorted(accepted))
    errors = [(mask, f"got a JSON {kind}, expected {expected}") for kind, mask in wrong.items()]
    return pa.array(out, arrow_type), errors


def _raw_columns(
    entity: EntitySet, records: Sequence[dict]
) -> tuple[dict[str, pa.Array], list[tuple[str, np.ndarray, str]]]:
    """Each known field as an Arrow array of its JSON type, or as text where kinds are mixed."""
    struct_type = json_struct_type(entity)
    errors: list[tuple[str, np.ndarray, str]] = []
    loose = _floats_in_integers(struct_type, records)
    if not loose:
        try:
            struct = pa.array(records, type=struct_type)
            return {f.name: struct.field(f.name) for f in entity.fields}, errors
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    columns: dict[str, pa.Array] = {}
    for fld in entity.fields:
        if fld.name not in loose:
            values = [r.get(fld.name) for r in records]
            try:
                columns[fld.name] = pa.array(values, type=struct_type.field(fld.name).type)
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                pass
        columns[fld.name], wrong = _loose_column(records, fld)
        errors.extend((fld.name, mask, reason) for mask, reason in wrong)
    return columns, errors


def _floats_in_integers(struct_type: pa.StructType, records: Sequence[dict]) -> set[str]:
    """Integer fields holding a JSON number with a fraction or exponent: pyarrow would
    truncate 1.5 to 1 without a word, so these columns take the loose path and reject it."""
    integers = [f.name for f in struct_type if f.type == pa.int64()]
    return {name for name in integers if any(type(r.get(name)) is float for r in records)}


def _extras(records: Sequence[dict], unknown: list[str]) -> pa.Array:
    rows = []
    for record in records:
        extra = {k: record[k] for k in unknown if k in record}
        rows.append(json.dumps(extra, ensure_ascii=False, default=str) if extra else None)
    return pa.array(rows, pa.string())


def _raw_json(record: object) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)


def _key_of(entity: EntitySet, record: object) -> str | None:
    if isinstance(record, dict) and record.get(entity.key) is not None:
        return str(record[entity.key])
    return None


def normalise(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    """Records as the API sends them -> canonical table, rejects and unknown members."""
    try:
        return _normalise(entity, records)
    except UnicodeEncodeError:  # a lone UTF-16 surrogate somewhere (rare): not storable
        return _surrogates_replaced(entity, records)


def _surrogates_replaced(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    """JSON may escape half a UTF-16 pair (the "\\ud83d" of an emoji cut in two), which is not
    Unicode: neither Arrow nor DuckDB (nor a JSON column) can store it. Such text is kept with
    U+FFFD in its place, with a warning per record whose raw JSON spells each half out."""
    cleaned: list[object] = []
    notes: list[Reject] = []
    for record in records:
        if not _has_surrogate(record):
            cleaned.append(record)
            continue
        clean = _map_text(record, _replaced)
        cleaned.append(clean)
        members = record.items() if type(record) is dict else ()
        touched = [k for k, v in members if _has_surrogate(k) or _has_surrogate(v)]
        notes.append(
            Reject(
                entity.name,
                _key_of(entity, clean),
                WARNING,
                tuple(_replaced(k) for k in touched),
                "text held half a UTF-16 surrogate pair (not Unicode); kept with U+FFFD in its "
                "place (raw_json spells it as the text \\uXXXX)",
                _raw_json(_map_text(record, _spelled)),
            )
        )
    batch = _normalise(entity, cleaned)
    batch.rejects += notes
    return batch


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str, only a lone half matches


def _has_surrogate(value: object) -> bool:
    if type(value) is str:
        return _SURROGATE.search(value) is not None
    if type(value) is dict:
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if type(value) is list:
        return any(_has_surrogate(v) for v in value)
    return False


def _map_text(value: Any, change: Callable[[str], str]) -> Any:
    """`value` with `change` applied to every string in it, member names included."""
    if type(value) is str:
        return change(value)
    if type(value) is dict:
        return {change(k): _map_text(v, change) for k, v in value.items()}
    if type(value) is list:
        return [_map_text(v, change) for v in value]
    return value


def _replaced(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _spelled(text: str) -> str:
    return _SURROGATE.sub(lambda half: f"\\u{ord(half.group()):04x}", text)


def _normalise(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    schema = arrow_schema(entity)
    objects = [r for r in records if type(r) is dict]
    rejects = [
        Reject(entity.name, None, REJECT, (), "record is not a JSON object", _raw_json(r))
        for r in records
        if type(r) is not dict
    ]
    if not objects:
        return NormalisedBatch(schema.empty_table(), rejects)

    unknown = sorted(set().union(*objects) - set(entity.by_name))
    counts = {name: sum(name in r for r in objects) for name in unknown}

    raw, problems = _raw_columns(entity, objects)
    errors = [(name, mask, reason) for name, mask, reason in problems]
    warnings: list[tuple[str, np.ndarray, str]] = []
    columns: list[pa.Array] = []
    for fld in entity.fields:
        column = raw[fld.name]
        if fld.required:
            errors.append((fld.name, ~_mask(column.is_valid()), "missing (required)"))
        converted = CONVERTERS[fld.canonical](column, fld)
        expected = f"expected {fld.canonical.value}"
        errors.extend((fld.name, m, f"{why}; {expected}") for m, why in converted.errors)
        warnings.extend((fld.name, m, why) for m, why in converted.warnings)
        columns.append(converted.values)
    columns.append(_extras(objects, unknown) if unknown else pa.nulls(len(objects), pa.string()))
    table = pa.Table.from_arrays(columns, schema=schema)

    rejected = np.zeros(len(objects), dtype=bool)
    for _, mask, _ in errors:
        rejected |= mask
    rejects += _notes(entity, objects, errors, REJECT, np.ones(len(objects), dtype=bool))
    rejects += _notes(entity, objects, warnings, WARNING, ~rejected)
    for name in unknown:
        example = next(r for r in objects if name in r)
        reason = f"field unknown to the catalogue in {counts[name]} records; kept in {EXTRAS}"
        rejects.append(
            Reject(entity.name, None, WARNING, (name,), reason, _raw_json(example)),
        )
    if unknown:
        log.warning("%s: %d unknown fields kept in %s", entity.name, len(unknown), EXTRAS)
    if rejected.any():
        log.warning("%s: %d of %d records rejected", entity.name, rejected.sum(), len(objects))
        table = table.filter(pa.array(~rejected))
    return NormalisedBatch(table, rejects, set(unknown))


def _notes(
    entity: EntitySet,
    records: Sequence[dict],
    problems: list[tuple[str, np.ndarray, str]],
    kind: str,
    rows: np.ndarray,
) -> list[Reject]:
    """One Reject per affected row, its reasons joined: `field: why; ...`."""
    by_row: dict[int, list[tuple[str, str]]] = {}
    for name, mask, why in problems:
        for i in np.flatnonzero(mask & rows):
            by_row.setdefault(int(i), []).append((name, why))
    return [
        Reject(
            entity.name,
            _key_of(entity, records[i]),
            kind,
            tuple(dict.fromkeys(name for name, _ in reasons)),
            "; ".join(f"{name}: {why}" for name, why in reasons),
            _raw_json(records[i]),
        )
        for i, reasons in sorted(by_row.items())
    ]
