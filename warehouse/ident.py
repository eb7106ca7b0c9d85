"""The one place identifiers become SQL: every table and column name passes through here.

Names come from the catalogue and, for unknown fields, from the source itself; quoting
them (doubling any embedded quote) makes a hostile name a name, never SQL.
"""

from __future__ import annotations

from collections.abc import Iterable


def quote(name: str) -> str:
    """A DuckDB quoted identifier: `x"y` -> `"x""y"`."""
    if "\x00" in name:
        raise ValueError("identifier contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    """`"schema"."table"`, both parts quoted."""
    return f"{quote(schema)}.{quote(table)}"


def column_list(names: Iterable[str], prefix: str = "") -> str:
    """`p."a", p."b"` for a SELECT or INSERT column list."""
    return ", ".join(prefix + quote(n) for n in names)


def literal(text: str) -> str:
    """A SQL string literal, for the few statements (COMMENT ON) that take no parameters."""
    if "\x00" in text:
        raise ValueError("text contains a NUL character")
    return "'" + text.replace("'", "''") + "'"
