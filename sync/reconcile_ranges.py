"""Key ranges: where the source's count and the keys held differ, found by halving.

Each range is asked as `$count=true&$top=100` over `<key> ge a and <key> lt b`. A range that
disagrees is halved at a held key: one request counts the lower half, the upper half's count
is the rest of its parent's. The same request brings the lower half's first page, which
settles its lowest hundred keys (held but gone: deleted; there but not held: inserted), so
what stays in doubt is the rest, with the rest of the count. A range of two pages is asked
for its first page alone; a range of at most a hundred records, or one cheaper to read than
to halve, is read. A range whose count agrees is left alone, unless records are `search`ed
for that a delete may hide in it (a count cannot tell one missing from one held but gone).

A set a small set navigates to is first split into the cells of its parents
(sync/reconcile_cells.py), and only the cells that differ are halved.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Expr, Query, all_of, between
from sync.reconcile_ledger import Ledger
from sync.reconcile_source import Source


@dataclass
class Span:
    """A key range from `low` (None: open; `past`: exclusive) to `high` (exclusive; None:
    open), within the cell `where` (None: the whole set), its held `keys` (sorted), the
    source's count in it (asked, or derived from its parent's), and, when its own request
    returned it, its first page."""

    low: Any
    high: Any
    keys: list[Any]
    count: int
    first: list[dict] | None = None
    past: bool = False
    where: Expr | None = None

    @property
    def held(self) -> int:
        return len(self.keys)


def search_cost(missing: int, total: int) -> int:
    """Requests a search for `missing` records hidden by as many deletes may spend: halving
    parts them from the deletes within a few levels; each is then found by narrowing."""
    if missing <= 0:
        return 0
    return 4 + 2 * missing * math.ceil(math.log2(max(2, total / PAGE_SIZE)))


def range_filter(key: str, span: Span, *, low: Any = None, past: bool = False) -> Expr | None:
    """The span's keys (from `low` instead of its own, when given) within its cell."""
    if low is None:
        low, past = span.low, span.past
    return all_of(span.where, between(key, low, span.high, past=past))


def counted_page(source: Source, where: Expr | None) -> dict[str, Any]:
    """One request: how many records `where` holds, and the lowest page of them by key (the
    first page of a keyset read, `read_on`)."""
    entity = source.entity
    query = Query(entity, filter=where, orderby=[(entity.key, False)], top=PAGE_SIZE, count=True)
    return source.page(query)


def read_on(source: Source, ledger: Ledger, span: Span) -> list[dict]:
    """A span counted with its first page (`first`, `count`), read on by keyset pages to its
    end. The read stops at the count, not a page later, where no held key of the span lies
    past the last key read: a record inserted between its pages past that key is then left
    to the next look's count (or the probe's newest writes); a held key past it (pushed on
    by such an insert, or deleted) is settled by the next page, not taken as deleted."""
    entity = source.entity
    records = page = span.first or []
    while len(page) >= PAGE_SIZE:
        last = ledger.key(page[-1])
        if last is None or (len(records) >= span.count and not _held_past(span, last)):
            break
        condition = range_filter(entity.key, span, low=last, past=True)
        query = Query(entity, filter=condition, orderby=[(entity.key, False)], top=PAGE_SIZE)
        page = source.page(query)["value"]
        records = records + page
    return records


def _held_past(span: Span, last: Any) -> bool:
    """Whether a held key of the span sorts after `last` (`keys` are sorted)."""
    return bool(span.keys) and span.keys[-1] > last


SplitByParent = Callable[[Span], list[Span] | None]


class KeyRanges:
    """Halves key ranges of one set against its `ledger`, within a request budget.
    `split_by_parent`: the set's cells that differ (None where counts per parent cannot
    help); `ranges`: how many ranges were counted or read."""

    def __init__(self, source: Source, ledger: Ledger, split_by_parent: SplitByParent) -> None:
        self.source, self.ledger, self.split_by_parent = source, ledger, split_by_parent
        self.key = source.entity.key
        self.ranges = 0

    def narrow(self, total: int, budget: int) -> None:
        """Find where the source's `total` and the held keys differ (an empty source is
        read: its one page shows every held key gone)."""
        whole = self._whole(total)
        if total <= 0:
            self._read(whole)
            return
        cells = self.split_by_parent(whole)
        self._halve(deque([whole] if cells is None else cells), budget)

    def search(self, total: int, budget: int, missing: int) -> None:
        """Find `missing` records that counts may not show (a delete cancels each): ranges
        that agree are halved too, widest first, until as many are found or `search_cost`
        requests are spent. Call `read_whole` instead where that costs no more."""
        limit = min(budget, self.source.requests + search_cost(missing, total))
        self._halve(deque([self._whole(total)]), budget, missing=missing, limit=limit)

    def read_whole(self, total: int) -> None:
        """The set read again, every key settled: surer than a search, and no dearer."""
        self._read(self._whole(total))

    def _whole(self, total: int) -> Span:
        return Span(None, None, sorted(self.ledger.held), total)

    def _halve(
        self, pending: deque[Span], budget: int, *, missing: int = 0, limit: int = 0
    ) -> None:
        """Counts of halves, each with its first page, until no range differs or the
        budget is spent; when searching, ranges that agree are halved next, until
        `missing` records are found or `limit` (a request count) is reached."""
        ledger, source = self.ledger, self.source
        agreeing: deque[Span] = deque()
        found_before = ledger.inserted
        while source.requests < budget:
            if pending:
                span = pending.popleft()
                if span.first is not None:  # its lowest keys are known: settle them
                    if rest := self._past_first(span):
                        pending.appendleft(rest)
                    continue
                if span.count == span.held:
                    if missing and span.count:
                        agreeing.append(span)
                    continue
            elif agreeing and ledger.inserted - found_before < missing:
                if source.requests >= limit:
                    break
                span = agreeing.popleft()
            else:
                break
            pages = math.ceil(max(span.count, span.held) / PAGE_SIZE)
            differ = abs(span.count - span.held)
            if span.held < 2 or pages <= 1 or (differ > 1 and pages <= differ * math.log2(pages)):
                self._read(span)
                continue
            if pages == 2:  # its first page settles half of it, and counts the rest
                self._count(span)
                pending.appendleft(span)
                continue
            middle = len(span.keys) // 2
            lower = replace(span, high=span.keys[middle], keys=span.keys[:middle])
            self._count(lower)
            pending.append(lower)
            upper = replace(span, low=span.keys[middle], keys=span.keys[middle:], past=False)
            pending.append(replace(upper, count=span.count - lower.count))
        ledger.confirm(source)

    def _read(self, span: Span) -> None:
        """The span read to its end, every held key of it settled."""
        first = self._range_page(span)
        counted = replace(span, count=int(first[COUNT]), first=first["value"])
        records = read_on(self.source, self.ledger, counted)
        self.ledger.settle_range(span.keys, records, cell=span.where is not None)

    def _count(self, span: Span) -> None:
        """One request: the span's count, and its first page."""
        first = self._range_page(span)
        span.count, span.first = int(first[COUNT]), first["value"]

    def _past_first(self, span: Span) -> Span | None:
        """Settle a span's keys up to the last of its first page; what lies past it remains
        (None: nothing does), its count the rest of the span's."""
        first = span.first or []
        cell = span.where is not None
        if len(first) >= span.count:  # the whole span came back
            self.ledger.settle_range(span.keys, first, cell=cell)
            return None
        last = self.ledger.key(first[-1])
        if last is None:  # nothing to settle by: the span stands as counted
            return replace(span, first=None)
        upto = bisect_right(span.keys, last)
        self.ledger.settle_range(span.keys[:upto], first, cell=cell)
        rest = span.count - len(first)
        return replace(span, low=last, keys=span.keys[upto:], count=rest, first=None, past=True)

    def _range_page(self, span: Span) -> dict[str, Any]:
        self.ranges += 1
        return counted_page(self.source, range_filter(self.key, span))
