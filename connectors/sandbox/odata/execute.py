"""Apply a `Query` to the rows of an entity set: filter, order, page, select, expand.

Rows arrive sorted by key, so key order costs nothing and every other order is a stable
sort that leaves ties in key order (deterministic paging). Key conditions in the filter
narrow the scan by bisection, and without `$count` the scan stops at the last row needed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from connectors.clinical_records.catalogue import PAGE_SIZE, Edm, EntitySet, Navigation
from connectors.sandbox.odata.edm_values import COERCE, INVALID
from connectors.sandbox.odata.filter import Compare, Expr
from connectors.sandbox.odata.options import Expand, Query


@dataclass
class Page:
    records: list[dict]  # shaped (select + expand applied), in order
    count: int | None  # total matching before paging, only when query.count


class TableView(Protocol):
    rows: Sequence[dict]  # all records, sorted ascending by key
    keys: Sequence  # the key values, parallel to rows


Related = Callable[[EntitySet, Navigation, dict], list[dict]]

# Key types whose raw JSON values order exactly as the catalogue type does.
BISECTABLE = frozenset({Edm.STRING, Edm.INT32})


def run_collection(query: Query, entity: EntitySet, table: TableView, related: Related) -> Page:
    """One page of a collection request; at most PAGE_SIZE records when `$top` is absent."""
    limit = PAGE_SIZE if query.top is None else query.top
    lo, hi = key_range(query.filter, entity, table.keys)
    direction = key_direction(query.orderby, entity)
    scanned = getattr(table, "scanned", None)
    if direction is not None and not query.count and (query.skip == 0 or scanned is None):
        indices = range(lo, hi) if direction == "asc" else range(hi - 1, lo - 1, -1)
        page, count = scan_page(map(table.rows.__getitem__, indices), query, limit), None
    else:  # every match is needed (a count, a sort) or was found before (a window)

        def scan() -> list[dict]:
            return matching(query, entity, table, (lo, hi), direction)

        text = None if query.filter is None else query.filter.text
        found = scan() if scanned is None else scanned((text, query.orderby, lo, hi), scan)
        page = found[query.skip : query.skip + limit]
        count = len(found) if query.count else None
    return Page([shape(record, query, entity, related) for record in page], count)


def matching(
    query: Query, entity: EntitySet, table: TableView, span: tuple[int, int], direction: str | None
) -> list[dict]:
    """Every row of `span` (indices of the key range) that the filter matches, in the
    requested order: the key's (`direction`), else a stable sort that leaves ties in key order."""
    lo, hi = span
    indices = range(hi - 1, lo - 1, -1) if direction == "desc" else range(lo, hi)
    rows = map(table.rows.__getitem__, indices)
    if direction is None:
        return _filtered_sorted(rows, query, entity)
    return list(rows if query.filter is None else filter(query.filter.predicate, rows))


def shape(record: dict, query: Query, entity: EntitySet, related: Related) -> dict:
    """One record as returned: only the selected fields, plus each expanded navigation."""
    if query.select is None:
        shaped = dict(record)
    else:
        shaped = {name: record.get(name) for name in query.select}
    for expand in query.expand:
        shaped.update(expanded(record, expand, entity, related))
    return shaped


def expanded(record: dict, expand: Expand, entity: EntitySet, related: Related) -> dict:
    """`{Nav: object|None}` or `{Nav@odata.count: n, Nav: [...]}` for one navigation."""
    nav, query = expand.navigation, expand.query
    target = nav.target_set
    found = related(entity, nav, record)
    if not nav.many:
        return {nav.name: shape(found[0], query, target, related) if found else None}
    in_key_order = sorted(found, key=sort_key(target.key_field.name, target.key_field.type))
    page, count = sort_and_page(in_key_order, query, target, query.top)
    body: dict[str, Any] = {} if count is None else {f"{nav.name}@odata.count": count}
    body[nav.name] = [shape(item, query, target, related) for item in page]
    return body


# -- paging ------------------------------------------------------------------------------------


def scan_page(rows: Iterable[dict], query: Query, limit: int) -> list[dict]:
    """Rows already in the requested order: filtered lazily, the scan stopped at the last
    row the page needs (no count: `run_collection` counts from `matching`)."""
    found = rows if query.filter is None else filter(query.filter.predicate, rows)
    return list(islice(found, query.skip, query.skip + limit))


def sort_and_page(
    rows: Iterable[dict], query: Query, entity: EntitySet, limit: int | None
) -> tuple[list[dict], int | None]:
    """Rows in key order: filter all, sort stably by `$orderby`, then skip and top."""
    matched = _filtered_sorted(rows, query, entity)
    end = None if limit is None else query.skip + limit
    return matched[query.skip : end], len(matched) if query.count else None


def _filtered_sorted(rows: Iterable[dict], query: Query, entity: EntitySet) -> list[dict]:
    """Rows in key order, filtered, then sorted stably by `$orderby` (ties stay in key order)."""
    matched = list(rows if query.filter is None else filter(query.filter.predicate, rows))
    for name, descending in reversed(query.orderby):
        matched.sort(key=sort_key(name, entity.field(name).type), reverse=descending)
    return matched


_NULL_KEY = (0, 0)


def sort_key(name: str, edm: Edm) -> Callable[[dict], tuple]:
    """Typed sort key; null (and unreadable values) sort first ascending, last descending."""
    coerce = COERCE[edm]

    def key(record: dict) -> tuple:
        value = record.get(name)
        if value is None:
            return _NULL_KEY
        value = coerce(value)
        return _NULL_KEY if value is INVALID else (1, value)

    return key


def key_direction(orderby: tuple[tuple[str, bool], ...], entity: EntitySet) -> str | None:
    """ "asc"/"desc" when the order is fixed by the (unique) key alone, else None."""
    if not orderby:
        return "asc"
    name, descending = orderby[0]
    if name != entity.key:
        return None
    return "desc" if descending else "asc"


# -- the keyset fast path ----------------------------------------------------------------------

# op -> (bound side, bisect function) for conditions `key op literal`
_BOUNDS: dict[str, tuple[tuple[str, Callable], ...]] = {
    "gt": (("lo", bisect_right),),
    "ge": (("lo", bisect_left),),
    "lt": (("hi", bisect_left),),
    "le": (("hi", bisect_right),),
    "eq": (("lo", bisect_left), ("hi", bisect_right)),
}


def key_range(where: Expr | None, entity: EntitySet, keys: Sequence) -> tuple[int, int]:
    """The slice of rows that can match, from `key op literal` conditions joined by `and`.

    Only a narrowing: the full filter still runs on every row in the slice.
    """
    bounds = {"lo": [0], "hi": [len(keys)]}
    if where is None or entity.key_field.type not in BISECTABLE:
        return 0, len(keys)
    try:
        for side, search, value in _key_conditions(where, entity):
            bounds[side].append(search(keys, value))
    except TypeError:  # a key of the wrong type in the table: scan everything instead
        return 0, len(keys)
    lo, hi = max(bounds["lo"]), min(bounds["hi"])
    return lo, max(lo, hi)


def _key_conditions(where: Expr, entity: EntitySet) -> Iterator[tuple[str, Callable, object]]:
    for part in where.conjuncts():
        if isinstance(part, Compare) and part.field.name == entity.key and part.value is not None:
            for side, search in _BOUNDS.get(part.op, ()):
                yield side, search, part.value
