"""One column of JSON values -> its canonical Arrow type, checked with pyarrow compute.

Each converter takes the column as the JSON gave it (or as text where its kinds were mixed)
and returns the cast column with the rows that failed, each with its reason; `normalise`
turns those into rejects. Nothing loops per value: regular expressions find the bad rows.
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
    Field,
)
from warehouse.schema import ARROW_BY_CANONICAL


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


def bool_mask(arr: pa.Array) -> np.ndarray:
    """A boolean Arrow column as a numpy mask, null as False."""
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
        too_long = bool_mask(pc.greater(pc.utf8_length(values), fld.max_length))
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
    return Converted(values, [(bool_mask(bad) | overflow, "not an integer within BIGINT's range")])


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
            (bool_mask(not_number), "not a decimal number"),
            (bool_mask(loses) | cast_bad, lossy),
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
    converted.errors.append((bool_mask(outside), "outside the years 0001-9999"))
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
            [
                (bool_mask(shape), "not an ISO 8601 date-time"),
                (impossible, "not a valid date-time"),
            ],
        )
    )


def to_time(arr: pa.Array, fld: Field) -> Converted:
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
