"""Read every record of a query, in key order, with no loss and no repeats, at the full rate.

The scheme:

1. The first request asks `$count=true&$top=100&$orderby=<key> asc` (plus the query's own
   filter, select and expand): page 0 and the total N.
2. The rest is fetched in parallel as `$skip` windows that overlap by one record: window k
   asks `$skip=k*99&$top=100`, so its first record is the previous window's last. Several
   windows are in flight at once (the limiter decides when each is sent), so a slow server
   still sees the whole allowed rate. Windows are yielded in order.
3. Each window is checked against what was already read: if its first key was already seen,
   the two windows join up (every record between them was read) and seen keys are dropped.
   If not, the source changed between the requests and a gap may lie between the last key
   read and the window's first key: it is repaired with sequential keyset paging,
   `(<filter>) and <key> gt <last> and <key> lt <first>`, before the window is yielded.
   An empty window means the data ended early (deletes): keyset paging reads on to the end.
4. After the last window, if it was full, keyset paging `<key> gt <last>` reads on until a
   short page (records inserted at the end during the run).
5. If the first page is shorter than asked although more records exist, the server caps
   the page size: that size is used for the windows, and a keyset page ends a run only when
   it is shorter than that size (or empty).
6. If the first response carries `@odata.nextLink`, the server drives paging: the links are
   followed one after another instead.

What this guarantees under change: every record that exists from the start to the end of
the read is read; a record is passed on once, unless a page answered later shows it in
another version (it is passed on again: no record a response carries is dropped). Windows
in flight are answered in any order: a window answered before the one that passed a record
on shows an older version of it, which is not passed on (yielded in key order, the older
answer would otherwise come last and win). A record inserted or deleted during the read may
or may not appear. Without change the count read equals `@odata.count`, and
a difference is logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, EntitySet
from connectors.clinical_records.errors import PagingError
from connectors.clinical_records.keys import entity_key
from connectors.clinical_records.query import Comparison, Query, all_of

log = logging.getLogger("connectors.clinical_records.paging")

Envelope = dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """A validated envelope and when its answer was read (the meter's clock, `Look`)."""

    envelope: Envelope
    answered: float


Fetch = Callable[[Query, int], Answer]  # (query, page number) -> the answer
FetchLink = Callable[[str, int], Answer]  # (nextLink, page number) -> the answer
Progress = Callable[[str, int, int], None]

NEXT_LINK = "@odata.nextLink"
COUNT = "@odata.count"
MAX_LINKS = 1_000_000


@dataclass
class Page:
    """One page of records as yielded to the caller; `total` is the first page's count."""

    records: list[dict]
    number: int
    total: int | None
    answered: float  # when the answer that brought it was read: of two, the later is newer


def paging_query(entity: EntitySet, query: Query | None) -> Query:
    """The query's filter, select and expand, ordered by the key; refuse what paging owns."""
    query = query or Query(entity)
    if query.entity is not entity:
        raise ValueError(f"the query is for {query.entity.name}, not {entity.name}")
    if query.top is not None or query.skip is not None:
        raise ValueError("iter_pages reads every record: leave $top and $skip to the pager")
    if any(_order_name(item) != entity.key for item in query.orderby):
        raise ValueError(f"iter_pages orders by the key {entity.key!r}; remove $orderby")
    select = query.select
    if select is not None and entity.key not in select:
        select = (entity.key, *select)
    return query.replace(select=select, orderby=[(entity.key, False)], count=False)


def _order_name(item: Any) -> str:
    return item[0] if isinstance(item, tuple) else str(item).split()[0]


class Pager:
    """One paging run over one query; see the module docstring for the scheme."""

    def __init__(
        self,
        entity: EntitySet,
        query: Query | None,
        fetch: Fetch,
        fetch_link: FetchLink,
        executor: Executor,
        in_flight: int,
        progress: Progress | None = None,
    ) -> None:
        self.entity = entity
        self.base = paging_query(entity, query)
        self.fetch = fetch
        self.fetch_link = fetch_link
        self.executor = executor
        self.in_flight = max(1, in_flight)
        self.progress = progress
        self.key = entity.key
        self.seen: set[Any] = set()
        # the last page's records by key (the overlap), with when their version was answered
        self.previous: dict[Any, tuple[dict, float]] = {}
        self.last: Any = None  # the greatest key read so far (keys are read in order)
        self.total: int | None = None
        self.number = 0
        self.pages_total = 1
        self.repairs = 0
        self.size = PAGE_SIZE  # the server's page size, as the first page shows it

    # -- the run ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Page]:
        answer = self.fetch(self.base.replace(count=True, top=PAGE_SIZE), 0)
        first = answer.envelope
        self.total = first.get(COUNT)
        records = first["value"]
        if first.get(NEXT_LINK):
            yield from self._emit(answer)
            yield from self._follow(first[NEXT_LINK])
            return
        if 0 < len(records) < PAGE_SIZE and (self.total or 0) > len(records):
            self.size = len(records)  # the server pages smaller than asked: follow its size
        size = self.size
        step = size - 1
        windows = math.ceil(max(0, (self.total or 0) - size) / step) if step > 0 else 0
        self.pages_total = 1 + windows
        yield from self._emit(answer)
        if windows == 0:
            if len(self.seen) < (self.total or 0):  # the server pages in ones: keyset it
                yield from self._keyset(upper=None)
            self._check_total()
            return
        last_full = False
        with closing(self._windows(windows, size, step)) as fetched:
            for answer in fetched:
                window = answer.envelope["value"]
                if not window:
                    yield from self._keyset(upper=None)  # deletes moved the end: read on to it
                    self._check_total()
                    return
                first_key = self._key(window[0])
                if first_key not in self.seen:
                    self.repairs += 1
                    yield from self._keyset(upper=first_key)
                yield from self._emit(answer)
                last_full = len(window) >= size
        if last_full:
            yield from self._keyset(upper=None)
        self._check_total()

    def _windows(self, count: int, size: int, step: int) -> Iterator[Answer]:
        """Window k = records k*step .. k*step+size-1, fetched ahead in parallel, in order."""
        pending: dict[int, Future[Answer]] = {}
        ahead = 2 * self.in_flight
        next_to_submit = 1
        try:
            for k in range(1, count + 1):
                while next_to_submit <= count and next_to_submit < k + ahead:
                    query = self.base.replace(skip=next_to_submit * step, top=size)
                    pending[next_to_submit] = self.executor.submit(
                        self.fetch, query, next_to_submit
                    )
                    next_to_submit += 1
                yield pending.pop(k).result()
        finally:
            for future in pending.values():
                future.cancel()

    def _keyset(self, upper: Any) -> Iterator[Page]:
        """Sequential keyset pages after `self.last` (and before `upper`), until the end."""
        while True:
            bounds = [] if self.last is None else [Comparison(self.key, "gt", self.last)]
            if upper is not None:
                bounds.append(Comparison(self.key, "lt", upper))
            query = self.base.replace(filter=all_of(self.base.filter, *bounds), top=PAGE_SIZE)
            answer = self.fetch(query, self.number)
            envelope, records = answer.envelope, answer.envelope["value"]
            before = self.last
            yield from self._emit(answer)
            if envelope.get(NEXT_LINK):
                yield from self._follow(envelope[NEXT_LINK])
            if not records:
                return
            if self.last == before:
                raise PagingError(f"keyset paging of {self.entity.name} did not advance")
            if len(records) < self.size:  # short by the server's own page size: the end
                return

    def _follow(self, link: str) -> Iterator[Page]:
        """Server-driven paging: follow `@odata.nextLink` until a page has none."""
        visited: set[str] = set()
        while link and len(visited) < MAX_LINKS:
            if link in visited:
                raise PagingError(f"{self.entity.name}: the same nextLink came twice")
            visited.add(link)
            answer = self.fetch_link(link, self.number)
            yield from self._emit(answer)
            link = answer.envelope.get(NEXT_LINK) or ""

    def _emit(self, answer: Answer) -> Iterator[Page]:
        """A page's records, each once: a key the previous page brought as it is now is the
        windows' overlap and dropped, and so is its older version from an answer read before
        the previous page's; one seen before in another version from a later answer (or
        further back) is passed on again, for a response's record is never dropped (the newer
        version wins the merge, sync/exactness.py)."""
        fresh = []
        keyed = []
        previous, self.previous = self.previous, {}
        for record in answer.envelope["value"]:
            key = self._key(record)
            if key is None:  # a record without a usable key: passed on for normalise to reject
                fresh.append(record)
                continue
            keyed.append(key)
            shown, shown_at = previous.get(key, (None, None))
            if shown_at is not None and answer.answered < shown_at:  # an older answer
                self.previous[key] = (shown, shown_at)
                continue
            # as sent (a reader may take from it), and when that answer was read
            self.previous[key] = (dict(record), answer.answered)
            if key not in self.seen:
                self.seen.add(key)
                fresh.append(record)
            elif shown != record:
                fresh.append(record)
        if keyed:
            self.last = keyed[-1]  # pages arrive in key order
        if fresh:
            yield Page(fresh, self.number, self.total, answer.answered)
            self.number += 1
            if self.progress is not None:
                self.progress(self.entity.name, self.number, max(self.pages_total, self.number))

    def _key(self, record: dict) -> str | int | None:
        return entity_key(self.entity, record.get(self.key))

    def _check_total(self) -> None:
        if self.total is not None and self.repairs == 0 and len(self.seen) != self.total:
            log.info(
                "%s: read %d records but @odata.count said %d (the source changed)",
                self.entity.name,
                len(self.seen),
                self.total,
            )
