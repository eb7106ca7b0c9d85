"""Values as `$filter` compares them: a literal, or a record's value read as its field's Edm
type. Records are JSON-shaped and may be hostile, so a value that cannot be read is INVALID,
which matches nothing, and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from connectors.clinical_records.catalogue import Edm

INVALID: Any = type("Invalid", (), {"__repr__": lambda self: "INVALID"})()
"""A record value that cannot be read as its field's type: it matches nothing."""

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_INSTANT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:\.([0-9]+))?)?(?:[Zz]|([+-])([0-9]{2}):?([0-9]{2}))"
)
_DECIMAL = re.compile(r"[+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+")
_EPOCH = datetime(1970, 1, 1)
_CACHE = 1 << 18

Instant = tuple[int, str]
"""(UTC epoch seconds, fraction digits without trailing zeros): exact, and orders as time."""


@lru_cache(maxsize=_CACHE)
def parse_instant(text: str) -> Instant | Any:
    """An ISO 8601 date-time with offset as an exact comparable instant, or INVALID."""
    match = _INSTANT.fullmatch(text)
    if match is None:
        return INVALID
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = match.groups()
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
    except ValueError:
        return INVALID
    offset = 0
    if sign:
        if int(off_h) > 23 or int(off_m) > 59:
            return INVALID
        offset = (int(off_h) * 3600 + int(off_m) * 60) * (1 if sign == "+" else -1)
    delta = local - _EPOCH
    return (delta.days * 86400 + delta.seconds - offset, (fraction or "").rstrip("0"))


@lru_cache(maxsize=_CACHE)
def parse_date(text: str) -> date | Any:
    match = _DATE.fullmatch(text)
    if match is None:
        return INVALID
    try:
        return date(*map(int, match.groups()))
    except ValueError:
        return INVALID


@lru_cache(maxsize=_CACHE)
def parse_decimal(text: str) -> Decimal | Any:
    return Decimal(text) if _DECIMAL.fullmatch(text) else INVALID


def _typed(kind: type) -> Callable[[object], object]:
    """Exact type test: bool is an int in Python, but not in Edm.Int32."""
    return lambda value: value if type(value) is kind else INVALID


def _via_text(parse: Callable[[str], object]) -> Callable[[object], object]:
    return lambda value: parse(value) if type(value) is str else INVALID


def _as_decimal(value: object) -> object:
    kind = type(value)
    if kind is str:
        return parse_decimal(value)
    if kind is int:
        return Decimal(value)
    if kind is float and value == value and abs(value) != float("inf"):  # type: ignore[operator]
        return Decimal(repr(value))
    return INVALID


COERCE: dict[Edm, Callable[[object], object]] = {
    Edm.STRING: _typed(str),
    Edm.INT32: _typed(int),
    Edm.BOOLEAN: _typed(bool),
    Edm.DECIMAL: _as_decimal,
    Edm.DATE: _via_text(parse_date),
    Edm.DATETIME: _via_text(parse_instant),
}
"""Read a (non-null) record value as its field's Edm type, or INVALID."""
