"""A value as a person reads it in a table the CLI prints: an exact decimal without the
trailing zeros of its column's scale (DECIMAL(38,12) keeps every value the spec allows, and
2985150.460000000000 is 2985150.46), NULL spelled out, never Python's `None`."""

from __future__ import annotations

from decimal import Decimal

NULL = "NULL"


def cell(value: object) -> str:
    if value is None:
        return NULL
    if isinstance(value, Decimal):
        return plain(value)
    return str(value)


def plain(value: Decimal) -> str:
    """The decimal's digits, no exponent and no trailing fractional zeros: 100, 0.5, -3."""
    if not value.is_finite():
        return str(value)
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
