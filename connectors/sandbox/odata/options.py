"""System query options (spec 4.2) parsed and validated into one immutable `Query`.

Every refusal is a 400 in the spec's error body that names the offending option, field or
navigation, so a client that would be refused by the real service is refused here first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from connectors.clinical_records.catalogue import (
    MAX_EXPAND_DEPTH,
    PAGE_SIZE,
    EntitySet,
    Navigation,
)
from connectors.sandbox.errors import invalid_filter, invalid_query
from connectors.sandbox.odata.filter import Expr, parse_filter


@dataclass(frozen=True)
class Expand:
    navigation: Navigation
    query: Query


@dataclass(frozen=True)
class Query:
    filter: Expr | None = None
    select: tuple[str, ...] | None = None
    orderby: tuple[tuple[str, bool], ...] = ()  # (field, descending)
    top: int | None = None  # None: not given (collections then get PAGE_SIZE)
    skip: int = 0
    count: bool = False
    expand: tuple[Expand, ...] = ()


# Options allowed where only one entity (or a single-valued navigation) is returned.
SINGLE_OPTIONS = ("$select", "$expand")
COLLECTION_OPTIONS = ("$filter", "$select", "$orderby", "$top", "$skip", "$count", "$expand")

_COUNT = {"true": True, "false": False}
_NATURAL = re.compile(r"[0-9]+")
_ORDER_ITEM = re.compile(r"\s*(?P<name>\S+?)(?:\s+(?P<dir>asc|desc))?\s*")
_NAV_ITEM = re.compile(r"\s*(?P<name>[^\s(]+)\s*(?:\((?P<options>.*)\))?\s*", re.DOTALL)


def parse_query(params: Mapping[str, str], entity: EntitySet, *, collection: bool = True) -> Query:
    """Validate the request's (URL-decoded) query parameters against `entity`.

    Parameters not starting with `$` are custom options and ignored. `collection=False` is
    the single-entity endpoint, where only `$select` and `$expand` are allowed.
    """
    return _parse(params, entity, collection, depth=0)


def _parse(params: Mapping[str, str], entity: EntitySet, collection: bool, depth: int) -> Query:
    allowed = COLLECTION_OPTIONS if collection else SINGLE_OPTIONS
    values: dict[str, object] = {}
    for name, text in params.items():
        if not name.startswith("$"):
            continue
        if name not in COLLECTION_OPTIONS:
            raise invalid_query(
                f"The query option {name} is not supported.",
                f"Supported system query options: {', '.join(COLLECTION_OPTIONS)}.",
            )
        if name not in allowed:
            raise invalid_query(
                f"The query option {name} is not allowed on a single entity.",
                f"Allowed here: {', '.join(allowed)}.",
            )
        values[name[1:]] = PARSERS[name](text, entity, depth)
    return Query(**values)  # type: ignore[arg-type]


def _filter(text: str, entity: EntitySet, depth: int) -> Expr:
    return parse_filter(text, entity)


def _top(text: str, entity: EntitySet, depth: int) -> int:
    top = _natural("$top", text)
    if top > PAGE_SIZE:
        raise invalid_query(
            f"The maximum page size is {PAGE_SIZE}: $top must be at most {PAGE_SIZE}.",
            f"$top={top} exceeds the maximum page size of {PAGE_SIZE}.",
        )
    return top


# A $skip past any table gives an empty page; capped so that skip + top stays a machine int.
SKIP_CEILING = 2**53


def _skip(text: str, entity: EntitySet, depth: int) -> int:
    return min(_natural("$skip", text), SKIP_CEILING)


def _natural(option: str, text: str) -> int:
    if not _NATURAL.fullmatch(text):
        raise invalid_query(
            f"{option} must be a non-negative integer.", f"Got {option}={text[:40]!r}."
        )
    return int(text)


def _count(text: str, entity: EntitySet, depth: int) -> bool:
    if text not in _COUNT:
        raise invalid_query("$count must be true or false.", f"Got $count={text[:40]!r}.")
    return _COUNT[text]


def _select(text: str, entity: EntitySet, depth: int) -> tuple[str, ...] | None:
    names = [name.strip() for name in text.split(",")]
    if "*" in names:
        return None
    for name in names:
        if name not in entity.by_name:
            raise invalid_query(
                f"Unknown property '{name}' in $select.", _no_property(name, entity)
            )
    return tuple(dict.fromkeys(names))


def _orderby(text: str, entity: EntitySet, depth: int) -> tuple[tuple[str, bool], ...]:
    items = []
    for item in text.split(","):
        match = _ORDER_ITEM.fullmatch(item)
        if match is None:
            raise invalid_query(
                "Invalid $orderby item.", f"Expected 'property [asc|desc]', got {item!r}."
            )
        name = match["name"]
        if name not in entity.by_name:
            raise invalid_query(
                f"Unknown property '{name}' in $orderby.", _no_property(name, entity)
            )
        items.append((name, match["dir"] == "desc"))
    return tuple(items)


def _no_property(name: str, entity: EntitySet) -> str:
    return f"Property '{name}' does not exist on type '{entity.qualified_type}'."


# -- $expand -----------------------------------------------------------------------------------


def _expand(text: str, entity: EntitySet, depth: int) -> tuple[Expand, ...]:
    if depth + 1 > MAX_EXPAND_DEPTH:
        raise invalid_query(
            f"The maximum $expand depth is {MAX_EXPAND_DEPTH}.",
            f"$expand is nested more than {MAX_EXPAND_DEPTH} levels deep.",
        )
    expands: dict[str, Expand] = {}
    for item in split_top_level(text, ",", "$expand"):
        match = _NAV_ITEM.fullmatch(item)
        if match is None:
            raise invalid_query("Invalid $expand item.", f"Could not read {item.strip()!r}.")
        navigation = entity.navigation.get(match["name"])
        if navigation is None:
            raise invalid_query(
                f"Unknown navigation property '{match['name']}' in $expand.",
                f"Navigation property '{match['name']}' does not exist on type "
                f"'{entity.qualified_type}'.",
            )
        if navigation.name in expands:
            raise invalid_query(f"'{navigation.name}' is expanded more than once.")
        nested = _nested_options(match["options"]) if match["options"] is not None else {}
        query = _parse(nested, navigation.target_set, navigation.many, depth + 1)
        expands[navigation.name] = Expand(navigation, query)
    return tuple(expands.values())


def capped(query: Query, cap: int) -> Query:
    """`query` with every expanded collection, at any depth, limited to `cap` items.

    Counting happens before paging, so a nested `$count` still tells the full number and a
    client can see that the server cut the list short.
    """
    if not query.expand:
        return query
    expands = []
    for item in query.expand:
        nested = capped(item.query, cap)
        if item.navigation.many:
            top = cap if nested.top is None else min(nested.top, cap)
            nested = replace(nested, top=top)
        expands.append(Expand(item.navigation, nested))
    return replace(query, expand=tuple(expands))


def expands_target(query: Query, target: str) -> bool:
    """Whether `$expand`, at any depth, reaches entities of `target`."""
    return any(
        item.navigation.target == target or expands_target(item.query, target)
        for item in query.expand
    )


def refuse_or(query: Query) -> None:
    """The spec's 400 for a `$filter`, at any depth of `$expand`, that uses `or`
    (SandboxConfig.refuse_filter_or: the spec lists eq, gt, ge, lt, le and `and`)."""
    if where := _disjunction(query, "$filter"):
        raise invalid_filter(
            "The operator 'or' is not supported in $filter.",
            f"{where} uses 'or'; supported operators: eq, gt, ge, lt, le, and.",
        )


def _disjunction(query: Query, where: str) -> str:
    if query.filter is not None and query.filter.uses_or():
        return where
    for item in query.expand:
        if found := _disjunction(item.query, f"The $filter of $expand={item.navigation.name}"):
            return found
    return ""


def _nested_options(text: str) -> dict[str, str]:
    """`$filter=...;$top=5` into a dict; every nested option must be a system option."""
    options: dict[str, str] = {}
    for part in split_top_level(text, ";", "$expand"):
        name, sep, value = part.strip().partition("=")
        if not sep or not name.startswith("$"):
            raise invalid_query(
                "Invalid nested option in $expand.", f"Expected '$option=value', got {part!r}."
            )
        if name in options:
            raise invalid_query(f"The nested option {name} is given more than once in $expand.")
        options[name] = value
    return options


def split_top_level(text: str, separator: str, option: str) -> list[str]:
    """Split on `separator` outside quotes and parentheses; refuse unbalanced text."""
    parts, start = [], 0
    for index, char, depth in _scan(text, option):
        if char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    if any(not part.strip() for part in parts):
        raise invalid_query(f"Empty item in {option}.", f"Got {text[:80]!r}.")
    return parts


def _scan(text: str, option: str) -> Iterator[tuple[int, str, int]]:
    """Each character outside string literals with its parenthesis depth."""
    depth, quoted = 0, False
    for index, char in enumerate(text):
        if char == "'":
            quoted = not quoted  # '' inside a literal toggles twice: still inside
            continue
        if quoted:
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
        yield index, char, depth
    if depth != 0 or quoted:
        raise invalid_query(f"Unbalanced parentheses or quotes in {option}.", f"Got {text[:80]!r}.")


PARSERS: dict[str, Callable[[str, EntitySet, int], object]] = {
    "$filter": _filter,
    "$select": _select,
    "$orderby": _orderby,
    "$top": _top,
    "$skip": _skip,
    "$count": _count,
    "$expand": _expand,
}
