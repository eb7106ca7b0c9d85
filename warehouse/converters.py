"""One column of JSON values -> its canonical Arrow type, checked with pyarrow compute.

Each converter takes the column as the JSON gave it (or as text where its kinds were mixed)
and returns the cast column with the rows whose value did not fit, each with its reason.
Such a value never costs its record: the column is null there (a date-time finer than a
microsecond: cut to microseconds), and `normalise` keeps the value as sent in `_extras`
and counts it. Nothing loops per value: regular expressions find the rows that differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.clinical_records.catalogue import (
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    Canonical,
    Edm,
    Field,
)
from warehouse.schema import ARROW_BY_CANONICAL

Rows = list[tuple[np.ndarray, str]]  # (mask of rows, why)


@dataclass
class Converted:
    """A column in its canonical type, the rows whose value did not fit it (null there, or
    cut), and notes on rows kept as they are (a string over its max length)."""

    values: pa.Array
    unfit: Rows = field(default_factory=list)
    warnings: Rows = field(default_factory=list)


# The JSON kinds each spec type accepts (spec section 2, type notes): a number where the
# spec says string is its text, decimals come as text or numbers; anything else does not fit.
KIND_BY_TYPE: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    dict: "object",
    list: "array",
}
ACCEPTED_KINDS: dict[Edm, frozenset[str]] = {
    Edm.STRING: frozenset({"string", "integer", "number"}),
    Edm.INT32: frozenset({"integer"}),
    Edm.DECIMAL: frozenset({"string", "integer", "number"}),
    Edm.BOOLEAN: frozenset({"boolean"}),
    Edm.DATE: frozenset({"string"}),
    Edm.DATETIME: frozenset({"string"}),
}
SPEC_SENDS: dict[Edm, str] = {
    Edm.STRING: "text",
    Edm.INT32: "an integer",
    Edm.DECIMAL: "decimal text",
    Edm.BOOLEAN: "true or false",
    Edm.DATE: "a date as text",
    Edm.DATETIME: "a date-time as text",
}
TEXT_BY_KIND: dict[str, Callable[[object], object]] = {
    "string": lambda v: v,
    "integer": str,  # its decimal text: 123 -> "123"
    "number": repr,  # the shortest text that reads back as the same float
    "boolean": lambda v: v,  # stays a bool: the only kind BOOLEAN accepts
}

# Decimal text (spec: Edm.Decimal, the sandbox's OpenAPI pattern): a sign, digits, a point
# anywhere among them. No exponent: 1e3 is not decimal text.
DECIMAL_RE = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
# ... that DECIMAL(38,12) holds exactly: leading zeros and a fraction's trailing ones aside.
DECIMAL_FITS_RE = (
    rf"^[+-]?0*[0-9]{{0,{DECIMAL_PRECISION - DECIMAL_SCALE}}}(\.[0-9]{{0,{DECIMAL_SCALE}}}0*)?$"
)
DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
# RFC 3339 and ISO 8601 extended, after `_uniform` (T, Z, a point before the fraction).
OFFSET = r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)"
_DATETIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?"
DATETIME_RE = _DATETIME + OFFSET + "$"
NO_OFFSET_RE = _DATETIME + "$"
# The common shape, cast at once.
PLAIN_DATETIME_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
FINER_RE = r"\.[0-9]{6}0*[1-9]"  # a digit past the microsecond that is not zero
TIME_RE = r"^(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]|24:00:00)$"  # 24:00:00: end of day

DECIMAL_TYPE = f"DECIMAL({DECIMAL_PRECISION},{DECIMAL_SCALE})"


def bool_mask(arr: pa.Array) -> np.ndarray:
    """A boolean Arrow column as a numpy mask, null as False."""
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _failing(arr: pa.Array, pattern: str) -> pa.Array:
    """True where a non-null value does not match `pattern`."""
    return pc.and_(arr.is_valid(), pc.invert(pc.match_substring_regex(arr, pattern)))


def _null_where(arr: pa.Array, bad: pa.Array) -> pa.Array:
    return pc.if_else(bad, pa.scalar(None, arr.type), arr)


def _cast_whole(arr: pa.Array, target: pa.DataType) -> pa.Array | None:
    """The whole column cast at once, or None when some value does not cast."""
    try:
        return pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _cast_each(arr: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Cast, and when one value spoils the whole cast, find it value by value (rare path).
    The values stay in Arrow: a Python object cannot hold every value Arrow can (year 0)."""
    whole = _cast_whole(arr, target)
    if whole is not None:
        return whole, np.zeros(len(arr), dtype=bool)
    pieces, bad = [], np.zeros(len(arr), dtype=bool)
    for i in range(len(arr)):
        one = _cast_whole(arr.slice(i, 1), target)
        if one is None:
            one = pa.nulls(1, target)
            bad[i] = arr[i].is_valid
        pieces.append(one)
    return pa.concat_arrays(pieces), bad


def to_varchar(arr: pa.Array, fld: Field) -> Converted:
    """Text as sent; a number (an id the spec types as a number here) as its decimal text."""
    values = arr if arr.type == pa.string() else pc.cast(arr, pa.string())
    result = Converted(values)
    if fld.max_length is not None:
        too_long = bool_mask(pc.greater(pc.utf8_length(values), fld.max_length))
        note = f"longer than the spec's max length {fld.max_length}; kept in full"
        result.warnings.append((too_long, note))
    return result


def to_bigint(arr: pa.Array, fld: Field) -> Converted:
    if arr.type == pa.int64():
        return Converted(arr)
    # Text here is the decimal text of JSON integers (the column's kinds were mixed): only
    # one beyond BIGINT's range fails the cast.
    values, beyond = _cast_each(arr, pa.int64())
    return Converted(values, [(beyond, "an integer beyond BIGINT's range")])


def to_decimal(arr: pa.Array, fld: Field) -> Converted:
    """Exact or not at all. The digits are counted here: Arrow's cast wraps a value past
    DECIMAL(38,...)'s range into another number without a word."""
    target = ARROW_BY_CANONICAL[Canonical.DECIMAL]
    not_number = _failing(arr, DECIMAL_RE)
    too_many = pc.and_(pc.invert(not_number), _failing(arr, DECIMAL_FITS_RE))
    bad = pc.or_(not_number, too_many)
    text = arr if not pc.any(bad).as_py() else _null_where(arr, bad)
    values = _cast_whole(text, target)
    if values is None:  # idle zeros past the precision (0012.50000000000000000): rare
        values = pc.cast(_without_idle_zeros(text), target)
    return Converted(
        values,
        [
            (bool_mask(not_number), "not decimal text"),
            (bool_mask(too_many), f"more digits than {DECIMAL_TYPE} holds"),
        ],
    )


def _without_idle_zeros(text: pa.Array) -> pa.Array:
    """Leading zeros and a fraction's trailing ones hold no digit, but Arrow counts them
    against the precision: 0012.50000000000000 is 12.5."""
    text = pc.replace_substring_regex(text, r"^([+-]?)0+([0-9])", r"\1\2")
    text = pc.replace_substring_regex(text, r"(\.[0-9]*[1-9])0+$", r"\1")
    return pc.replace_substring_regex(text, r"\.0+$", r".0")


def to_boolean(arr: pa.Array, fld: Field) -> Converted:
    return Converted(arr if arr.type == pa.bool_() else pc.cast(arr, pa.bool_()))


def _in_years(converted: Converted) -> Converted:
    """Dates and times outside the years 0001-9999 (in UTC) do not fit: Python's `date` and
    `datetime`, and so most analysts' clients, cannot read them."""
    year = pc.year(converted.values)
    outside = pc.or_(pc.less(year, 1), pc.greater(year, 9999))
    converted.values = _null_where(converted.values, outside)
    converted.unfit.append((bool_mask(outside), "outside the years 0001-9999"))
    return converted


def to_date(arr: pa.Array, fld: Field) -> Converted:
    shape = _failing(arr, DATE_RE)
    text = _null_where(arr, shape)
    shape_error = (bool_mask(shape), "not a date YYYY-MM-DD")
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
    return _in_years(
        Converted(values, [shape_error, (bool_mask(impossible), "not a calendar date")])
    )


def _uniform(text: pa.Array) -> pa.Array:
    """The spellings RFC 3339 and ISO 8601 allow beside the one Arrow reads: a lower-case
    t or z, a comma before the fraction."""
    text = pc.replace_substring_regex(text, r"^([0-9]{4}-[0-9]{2}-[0-9]{2})t", r"\1T")
    text = pc.replace_substring_regex(text, r"z$", "Z")
    return pc.replace_substring_regex(text, r"(:[0-9]{2}),([0-9])", r"\1.\2")


def _cut_fraction(text: pa.Array) -> pa.Array:
    """Microseconds are the warehouse's precision: longer fractions are cut."""
    return pc.replace_substring_regex(text, r"(\.[0-9]{6})[0-9]+", r"\1")


def to_timestamptz(arr: pa.Array, fld: Field) -> Converted:
    """An instant in UTC. A value without an offset names no instant and is not taken as
    UTC; one finer than a microsecond is cut to microseconds and kept as sent as well."""
    target = ARROW_BY_CANONICAL[Canonical.TIMESTAMPTZ]
    # The common shape (seconds, up to six fractional digits, Z or +HH:MM) is one pattern
    # and one cast, unless some value differs. (A cast that fails costs about 25 times one
    # that succeeds.)
    if not pc.any(_failing(arr, PLAIN_DATETIME_RE)).as_py():
        values = _cast_whole(arr, target)
        if values is not None:
            return _in_years(Converted(values))
    text = _uniform(arr)
    no_offset = pc.match_substring_regex(text, NO_OFFSET_RE)
    shape = pc.and_(_failing(text, DATETIME_RE), pc.invert(no_offset))
    finer = pc.and_(pc.invert(shape), pc.match_substring_regex(text, FINER_RE))
    text = _cut_fraction(_null_where(text, pc.or_(shape, no_offset)))
    values, impossible = _cast_each(text, target)
    return _in_years(
        Converted(
            values,
            [
                (bool_mask(no_offset), "a date-time without an offset (not taken as UTC)"),
                (bool_mask(shape), "not an ISO 8601 date-time"),
                (impossible, "not a valid date-time"),
                (bool_mask(finer) & ~impossible, "finer than a microsecond; cut to microseconds"),
            ],
        )
    )


def to_time(arr: pa.Array, fld: Field) -> Converted:
    """HH:MM:SS; 24:00:00, the end of a day, is DuckDB's TIME '24:00:00' as well."""
    bad = _failing(arr, TIME_RE)
    text = _null_where(arr, bad)

    def part(start: int) -> pa.Array:
        return pc.cast(pc.utf8_slice_codeunits(text, start, start + 2), pa.int64())

    seconds = pc.add(pc.add(pc.multiply(part(0), 3600), pc.multiply(part(3), 60)), part(6))
    micros = pc.multiply(seconds, 1_000_000)
    return Converted(micros.view(pa.time64("us")), [(bool_mask(bad), "not a time HH:MM:SS")])


CONVERTERS: dict[Canonical, Callable[[pa.Array, Field], Converted]] = {
    Canonical.VARCHAR: to_varchar,
    Canonical.BIGINT: to_bigint,
    Canonical.DECIMAL: to_decimal,
    Canonical.BOOLEAN: to_boolean,
    Canonical.DATE: to_date,
    Canonical.TIMESTAMPTZ: to_timestamptz,
    Canonical.TIME: to_time,
}
