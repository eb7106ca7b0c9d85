"""Children by reference: records whose parent was deleted before its page.

Such children come with no parent's page, and no key range shows them apart from the
deletes that cancel them in a count. They share that parent's reference, so ranges of the
reference (not of the key) are halved, following those that count more records than the
references held in them, and all of one parent's children turn up in one search.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE
from connectors.clinical_records.keys import key_text
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Query, between
from sync.reconcile_ledger import Ledger
from sync.reconcile_ranges import Span, counted_page, read_on, search_cost
from sync.reconcile_source import Source

# A range of references: (low, high, i, j, count): its held refs[i:j], the source's count in
# it (None: not known, for the whole: both halves are then asked).
RefRange = tuple[Any, Any, int, int, int | None]


class ChildrenByReference:
    """Searches one set for children no read brought, by ranges of a reference field.
    `ranges`: how many ranges were counted or read."""

    def __init__(self, source: Source, ledger: Ledger) -> None:
        self.source, self.ledger = source, ledger
        self.ranges = 0

    def find(
        self, ref: str, refs: list[Any], expected: int, parents: set[str | None]
    ) -> list[dict]:
        """Records not held whose `ref` is no parent read, up to `expected` of them.
        `refs`: the sorted references of the records held; `parents`: the parents read
        (`key_text`): a record found under one of them is new (written during the run),
        returned but not one of the `expected`. Returns the records found (not yet taken);
        bounded by `search_cost`."""
        found: list[dict] = []
        if not refs or expected <= 0:
            return found
        start, limit = self.source.requests, search_cost(expected, len(refs) + expected)
        pending: deque[RefRange] = deque([(None, None, 0, len(refs), None)])

        def follow(low: Any, high: Any, i: int, j: int, count: int | None) -> None:
            if count is not None and count > j - i:  # more there than held: some not read
                pending.append((low, high, i, j, count))

        def orphans() -> int:
            return sum(key_text(r.get(ref)) not in parents for r in found)

        while pending and orphans() < expected and self.source.requests - start < limit:
            low, high, i, j, count = pending.popleft()
            middle = _split(refs, i, j)
            if middle is None:  # one reference only: its children are read
                self._read(ref, low, high, found)
                continue
            lower = self._count(ref, low, refs[middle], found)
            if lower is None:  # settled: its count, for the upper's, is what came back
                lower = middle - i + sum(1 for r in found if _within(r.get(ref), low, refs[middle]))
            else:
                follow(low, refs[middle], i, middle, lower)
            if count is None:
                follow(refs[middle], high, middle, j, self._count(ref, refs[middle], high, found))
            else:
                follow(refs[middle], high, middle, j, count - lower)
        self.ledger.count_inserted(len(found))
        return found

    def _count(self, ref: str, low: Any, high: Any, found: list[dict]) -> int | None:
        """One request counts the records whose `ref` lies in [low, high); a range of at
        most a page comes back whole with it: its records not held join `found`, and None
        is returned, for the range is settled."""
        entity = self.source.entity
        self.ranges += 1
        orderby = [(ref, False), (entity.key, False)]
        query = Query(
            entity, filter=between(ref, low, high), orderby=orderby, top=PAGE_SIZE, count=True
        )
        envelope = self.source.page(query)
        count, records = int(envelope[COUNT]), envelope["value"]
        if len(records) < count:
            return count
        self._gather(records, found)
        return None

    def _read(self, ref: str, low: Any, high: Any, found: list[dict]) -> None:
        """The records whose `ref` lies in [low, high), read by keyset pages to the count the
        first carried (`read_on`; it settles no held key): those not held join `found`."""
        self.ranges += 1
        where = between(ref, low, high)
        first = counted_page(self.source, where)
        span = Span(None, None, [], int(first[COUNT]), first=first["value"], where=where)
        self._gather(read_on(self.source, self.ledger, span), found)

    def _gather(self, records: list[dict], found: list[dict]) -> None:
        seen = {self.ledger.key(r) for r in found}
        for record in records:
            if (key := self.ledger.key(record)) not in self.ledger.held and key not in seen:
                found.append(record)
                seen.add(key)


def _split(refs: list[Any], i: int, j: int) -> int | None:
    """An index in (i, j) where the sorted `refs` change value, nearest their middle (a
    range boundary must not cut one reference's records in two); None if all are equal."""
    middle = (i + j) // 2
    after, before = bisect_right(refs, refs[middle], i, j), bisect_left(refs, refs[middle], i, j)
    choices = [m for m in (before, after) if i < m < j]
    return min(choices, key=lambda m: abs(m - middle)) if choices else None


def _within(value: Any, low: Any, high: Any) -> bool:
    return value is not None and (low is None or value >= low) and (high is None or value < high)
