"""An in-memory `Source` (sync/reconcile_source.py) that changes on cue, for unit tests.

It answers the shapes reconciliation builds as the spec (4.2) and our sandbox answer them:
`$filter` of `eq, gt, ge, lt, le` joined by `and` (a comparison with null matches nothing
but `eq null`; a null value matches no ordering), `$orderby` on one or more fields (stable,
ties in key order, null first ascending and last descending), `$top`, `$count` (before
paging), `$select`, and the small set's `$expand=<nav>($count=true;$top=0)`. Anything else
raises, so a new shape in reconciliation shows here rather than passing by accident.

`before(n, change)` applies `change` just before the n-th request of the run (1-based; the
extraction's own read, `read_page`, counts in this clock too) is answered: an insert, update
or delete between two requests. `requests` counts reconciliation's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, Edm, EntitySet
from connectors.clinical_records.errors import ApiError
from connectors.clinical_records.keys import key_text
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Comparison, Expand, Expr, Junction, Query

ORDERING = {
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
}


class MemorySource:
    """One set's records (and, for counts per parent, its small set's), as a service would
    answer them now. `sent`: every query answered, in order; `clock`: their number;
    `requests`: those reconciliation sent (the `Source` protocol's)."""

    def __init__(
        self,
        entity: EntitySet,
        records: Iterable[dict],
        *,
        small: tuple[EntitySet, list[dict]] | None = None,
        refuse_parent_counts: bool = False,
    ) -> None:
        self.entity = entity
        self.tables: dict[str, list[dict]] = {entity.name: [dict(r) for r in records]}
        if small is not None:
            self.tables[small[0].name] = [dict(r) for r in small[1]]
        self.refuse_parent_counts = refuse_parent_counts
        self.requests = self.clock = 0
        self.sent: list[Query | str] = []
        self.cues: dict[int, list[Callable[[], None]]] = {}

    # -- changes ------------------------------------------------------------------------------

    def before(self, request: int, change: Callable[[], None]) -> None:
        """`change` applied just before the `request`-th request of the run is answered."""
        self.cues.setdefault(request, []).append(change)

    def insert(self, record: dict) -> None:
        self.tables[self.entity.name].append(dict(record))

    def update(self, key: Any, **fields: Any) -> None:
        self._find(key).update(fields)

    def delete(self, key: Any) -> None:
        self.tables[self.entity.name].remove(self._find(key))

    def _find(self, key: Any) -> dict:
        return next(r for r in self.tables[self.entity.name] if r[self.entity.key] == key)

    # -- the Source protocol ------------------------------------------------------------------

    def read_page(self, query: Query) -> dict[str, Any]:
        """A page of the extraction's own read: on the clock, not reconciliation's cost."""
        return self._page(query, counted=False)

    def page(self, query: Query) -> dict[str, Any]:
        return self._page(query)

    def _page(self, query: Query, *, counted: bool = True) -> dict[str, Any]:
        self._request(query, counted=counted)
        if query.expand and self.refuse_parent_counts:
            raise ApiError(400, "InvalidQuery", "$expand with $count is not supported")
        matched = self._matching(query.entity, query)
        top = PAGE_SIZE if query.top is None else query.top
        page = matched[query.skip or 0 : (query.skip or 0) + top]
        envelope: dict[str, Any] = {"value": [self._shape(query, r) for r in page]}
        if query.count:
            envelope[COUNT] = len(matched)
        return envelope

    def by_key(self, keys: Sequence[Any]) -> list[dict | None]:
        found = []
        for key in keys:
            self._request(f"{self.entity.name}({key})")
            table = self.tables[self.entity.name]
            found.append(next((dict(r) for r in table if r[self.entity.key] == key), None))
        return found

    # -- answers -------------------------------------------------------------------------------

    def _request(self, what: Query | str, *, counted: bool = True) -> None:
        self.requests += counted
        self.clock += 1
        for change in self.cues.pop(self.clock, []):
            change()
        self.sent.append(what)

    def _matching(self, entity: EntitySet, query: Query) -> list[dict]:
        rows = sorted(self.tables[entity.name], key=_order(entity, entity.key))
        if query.filter is not None:
            rows = [r for r in rows if _matches(entity, query.filter, r)]
        for item in reversed(query.orderby):
            assert isinstance(item, tuple), "reconciliation orders by (name, descending)"
            name, descending = item
            rows.sort(key=_order(entity, name), reverse=descending)
        return rows

    def _shape(self, query: Query, record: dict) -> dict:
        shaped = dict(record) if query.select is None else {k: record.get(k) for k in query.select}
        for item in query.expand:
            assert isinstance(item, Expand) and item.top == 0 and item.count, item
            navigation = query.entity.navigation[item.name]
            parent = key_text(record.get(query.entity.key))
            children = self.tables[navigation.target]
            count = sum(key_text(c.get(navigation.remote)) == parent for c in children)
            shaped[f"{item.name}{COUNT}"] = count
            shaped[item.name] = []
        return shaped


def _typed(entity: EntitySet, name: str, value: Any) -> Any:
    """A value as the service compares it: a date-time as an instant, others as sent."""
    if value is not None and entity.field(name).type is Edm.DATETIME:
        return datetime.fromisoformat(value)
    return value


def _order(entity: EntitySet, name: str) -> Callable[[dict], tuple]:
    def key(record: dict) -> tuple:
        value = record.get(name)
        return (0,) if value is None else (1, _typed(entity, name, value))

    return key


def _matches(entity: EntitySet, condition: Expr, record: dict) -> bool:
    if isinstance(condition, Junction):
        assert condition.op == "and", "the spec lists `and` alone among the joins"
        return all(_matches(entity, part, record) for part in condition.parts)
    assert isinstance(condition, Comparison), condition
    value = record.get(condition.name)
    if condition.value is None:
        assert condition.op == "eq", condition
        return value is None
    if value is None:
        return False
    value, literal = _typed(entity, condition.name, value), condition.value
    literal = _typed(entity, condition.name, literal)
    if condition.op == "eq":
        return value == literal
    return ORDERING[condition.op](value, literal)
