"""A small typed OData query builder, checked against the entity catalogue before sending.

`(F("status") == "Completed") & F("updated_at").ge(since)` renders, for Appointments, as
`(status eq 'Completed' and updated_at ge 2024-01-01T00:00:00Z)`. Literals are formatted by
the field's Edm type as spec 4.2 says: strings single-quoted with `''` escaping, dates and
date-times bare, numbers bare, `true`/`false`, `null`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from connectors.clinical_records.catalogue import (
    MAX_EXPAND_DEPTH,
    PAGE_SIZE,
    Edm,
    EntitySet,
)
from connectors.clinical_records.errors import QueryError

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})")
_DECIMAL = re.compile(r"-?\d+(\.\d+)?")


def quote(text: str) -> str:
    """An OData string literal: single quotes, an embedded quote doubled."""
    return "'" + text.replace("'", "''") + "'"


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a str")
    return quote(value)


def _integer(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("an int")
    return str(value)


def _decimal(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise TypeError("an int, Decimal or decimal text")
    text = str(value)
    if not _DECIMAL.fullmatch(text):
        raise TypeError("a plain decimal number")
    return text


def _boolean(value: Any) -> str:
    if not isinstance(value, bool):
        raise TypeError("a bool")
    return "true" if value else "false"


def _date(value: Any) -> str:
    if isinstance(value, datetime):
        raise TypeError("a date, not a datetime")
    text = value.isoformat() if isinstance(value, date) else value
    if not isinstance(text, str) or not _DATE.fullmatch(text):
        raise TypeError("a date or YYYY-MM-DD text")
    return text


def _datetime(value: Any) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("a timezone-aware datetime")
        text = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    elif isinstance(value, str):
        text = value.upper()  # RFC 3339 allows `t` and `z`; a cursor is sent back as it came
    else:
        text = value
    if not isinstance(text, str) or not _DATETIME.fullmatch(text):
        raise TypeError("an aware datetime or ISO 8601 text with an offset or Z")
    return text


# Edm type -> literal formatter (spec 4.2); each raises TypeError naming what it wanted.
LITERALS: dict[Edm, Callable[[Any], str]] = {
    Edm.STRING: _string,
    Edm.INT32: _integer,
    Edm.DECIMAL: _decimal,
    Edm.BOOLEAN: _boolean,
    Edm.DATE: _date,
    Edm.DATETIME: _datetime,
}


def literal(entity: EntitySet, name: str, value: Any) -> str:
    """`value` as a literal for field `name` of `entity`; None is `null`."""
    fld = _field(entity, name)
    if value is None:
        return "null"
    try:
        return LITERALS[fld.type](value)
    except TypeError as wanted:
        raise QueryError(
            f"{entity.name}.{name} is {fld.type.value}: expected {wanted}, "
            f"got {type(value).__name__}"
        ) from None


def _field(entity: EntitySet, name: str):
    if name not in entity.by_name:
        raise QueryError(f"{entity.name} has no field {name!r}")
    return entity.by_name[name]


# -- filter expressions -------------------------------------------------------------------------


class Expr:
    """A boolean filter expression; combine with `&`, `|` and `~`."""

    def render(self, entity: EntitySet) -> str:
        raise NotImplementedError

    def __and__(self, other: Expr) -> Expr:
        return Junction("and", (self, other))

    def __or__(self, other: Expr) -> Expr:
        return Junction("or", (self, other))

    def __invert__(self) -> Expr:
        return Negation(self)


@dataclass(frozen=True, eq=False)
class Comparison(Expr):
    name: str
    op: str
    value: Any

    def render(self, entity: EntitySet) -> str:
        return f"{self.name} {self.op} {literal(entity, self.name, self.value)}"


@dataclass(frozen=True, eq=False)
class StartsWith(Expr):
    name: str
    prefix: str

    def render(self, entity: EntitySet) -> str:
        if _field(entity, self.name).type is not Edm.STRING:
            raise QueryError(f"startswith needs a string field; {entity.name}.{self.name} is not")
        return f"startswith({self.name},{literal(entity, self.name, self.prefix)})"


@dataclass(frozen=True, eq=False)
class Junction(Expr):
    op: str
    parts: tuple[Expr, ...]

    def render(self, entity: EntitySet) -> str:
        return "(" + f" {self.op} ".join(part.render(entity) for part in self.parts) + ")"


@dataclass(frozen=True, eq=False)
class Negation(Expr):
    operand: Expr

    def render(self, entity: EntitySet) -> str:
        return f"not ({self.operand.render(entity)})"


@dataclass(frozen=True, eq=False)
class Raw(Expr):
    """A filter already written as OData text (validated by the service, not here)."""

    text: str

    def render(self, entity: EntitySet) -> str:
        return f"({self.text})"


class F:
    """A field reference: `F("status") == "x"`, `F("id") > 5`, `F("name").startswith("A")`."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, value: object) -> Comparison:  # type: ignore[override]
        return Comparison(self.name, "eq", value)

    def __ne__(self, value: object) -> Comparison:  # type: ignore[override]
        return Comparison(self.name, "ne", value)

    def __gt__(self, value: Any) -> Comparison:
        return Comparison(self.name, "gt", value)

    def __ge__(self, value: Any) -> Comparison:
        return Comparison(self.name, "ge", value)

    def __lt__(self, value: Any) -> Comparison:
        return Comparison(self.name, "lt", value)

    def __le__(self, value: Any) -> Comparison:
        return Comparison(self.name, "le", value)

    eq, ne, gt, ge, lt, le = __eq__, __ne__, __gt__, __ge__, __lt__, __le__

    def startswith(self, prefix: str) -> StartsWith:
        return StartsWith(self.name, prefix)


def all_of(*parts: Expr | None) -> Expr | None:
    """The conjunction of the parts that are not None."""
    present = tuple(part for part in parts if part is not None)
    if not present:
        return None
    return present[0] if len(present) == 1 else Junction("and", present)


def any_of(*parts: Expr) -> Expr:
    """The disjunction of the parts (one part: itself); spec 4.2 does not list `or` among
    the operators seen, so a caller must be ready for a 400 (sync/orphans.py)."""
    if not parts:
        raise QueryError("any_of needs at least one condition")
    return parts[0] if len(parts) == 1 else Junction("or", tuple(parts))


def between(name: str, low: Any = None, high: Any = None, *, past: bool = False) -> Expr | None:
    """`name ge low and name lt high` (`gt low` when `past`); a bound of None is open."""
    return all_of(
        None if low is None else Comparison(name, "gt" if past else "ge", low),
        None if high is None else Comparison(name, "lt", high),
    )


# -- queries ------------------------------------------------------------------------------------

OrderItem = str | tuple[str, bool]  # "name", "name desc" or (name, descending)


@dataclass(frozen=True, kw_only=True)
class Options:
    """The system query options a collection and a nested `$expand` share."""

    filter: Expr | None = None
    select: Sequence[str] | None = None
    orderby: Sequence[OrderItem] = ()
    top: int | None = None
    skip: int | None = None
    count: bool = False
    expand: Sequence[Expand | str] = ()


@dataclass(frozen=True)
class Expand(Options):
    """`$expand` of one navigation property, with nested options."""

    name: str


@dataclass(frozen=True)
class Query(Options):
    """System query options for one entity set; `params()` renders and validates them."""

    entity: EntitySet

    def __post_init__(self) -> None:
        self.params()  # validate against the catalogue now, before any request

    def params(self) -> dict[str, str]:
        """The query options as `$name -> text`, in a fixed order."""
        return _options(self.entity, self, depth=0)

    def shows(self) -> frozenset[str]:
        """The entity sets whose records or counts the answer reflects: this one and every
        set its `$expand` reaches, nested ones too (the request is a look at each)."""
        return frozenset(_shown(self.entity, self))

    def replace(self, **changes: Any) -> Query:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return Query(**values)


def _options(entity: EntitySet, q: Query | Expand, depth: int) -> dict[str, str]:
    params: dict[str, str] = {}
    if q.filter is not None:
        params["$filter"] = q.filter.render(entity)
    if q.select is not None:
        for name in q.select:
            _field(entity, name)
        params["$select"] = ",".join(dict.fromkeys(q.select))
    if q.orderby:
        params["$orderby"] = ",".join(_order_item(entity, item) for item in q.orderby)
    if q.top is not None:
        if not 0 <= q.top <= PAGE_SIZE:
            raise QueryError(f"$top must be between 0 and {PAGE_SIZE}, got {q.top}")
        params["$top"] = str(q.top)
    if q.skip is not None:
        if q.skip < 0:
            raise QueryError(f"$skip must not be negative, got {q.skip}")
        params["$skip"] = str(q.skip)
    if q.count:
        params["$count"] = "true"
    if q.expand:
        params["$expand"] = ",".join(_expand(entity, item, depth + 1) for item in q.expand)
    return params


def _shown(entity: EntitySet, q: Query | Expand) -> Iterator[str]:
    yield entity.name
    for item in q.expand:
        spec = Expand(item) if isinstance(item, str) else item
        yield from _shown(entity.navigation[spec.name].target_set, spec)


def _order_item(entity: EntitySet, item: OrderItem) -> str:
    if isinstance(item, tuple):
        name, descending = item
    else:
        name, _, direction = item.strip().partition(" ")
        if direction.strip() not in ("", "asc", "desc"):
            raise QueryError(f"$orderby direction must be asc or desc, got {direction.strip()!r}")
        descending = direction.strip() == "desc"
    _field(entity, name)
    return f"{name} {'desc' if descending else 'asc'}"


def _expand(entity: EntitySet, item: Expand | str, depth: int) -> str:
    if depth > MAX_EXPAND_DEPTH:
        raise QueryError(f"$expand may nest at most {MAX_EXPAND_DEPTH} levels")
    spec = Expand(item) if isinstance(item, str) else item
    navigation = entity.navigation.get(spec.name)
    if navigation is None:
        known = ", ".join(entity.navigation) or "none"
        raise QueryError(f"{entity.name} has no navigation {spec.name!r} (known: {known})")
    if not navigation.many and (spec.filter or spec.orderby or spec.top or spec.skip or spec.count):
        raise QueryError(f"{entity.name}.{spec.name} is single-valued: only select and expand")
    nested = _options(navigation.target_set, spec, depth)
    if not nested:
        return spec.name
    return f"{spec.name}(" + ";".join(f"{k}={v}" for k, v in nested.items()) + ")"
