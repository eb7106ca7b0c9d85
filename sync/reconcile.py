"""Reconciliation: an extraction ends equal to the source as it stands when it ends.

Paging reads every record that stays put (connectors/clinical_records/paging.py). A source
that changes while it is read leaves three differences behind: an insert whose key sorts
before keys already read, an update of a record already read, and a delete of one. They
are found at the cost of a few requests:

1. Before the read, the change mark: the newest value of the set's change cursor
   (`$orderby=<cursor> desc`). Every write after it carries a cursor at or after it.
2. After the read, rounds that each start with one probe: `$count=true&$top=100&$orderby=
   <cursor> desc` answers, at one moment, the set's total and its newest writes. Those at or
   after the mark that differ from the version held are re-read into the batch, and the
   mark moves up to the newest the probe saw. A set without a cursor probes `$orderby=<key>
   desc`: a set of at most a hundred records comes back whole and is compared key by key; a
   larger one has its highest hundred keys (where new records get their numbers) compared.
   **The run's last look at a set comes after every other request to it.** A probe that
   holds every write since the mark (fewer than a hundred) is such a look. One whose hundred
   all lie there (a date cursor: the whole day shares one value) cannot show the rest: the
   records at or after the mark (the window) are read again (`<cursor> ge <mark>`, pages in
   flight), and since that read is no look at one moment (a write may land on a page it
   has passed), the probe is asked again, followed by one request that counts the window
   and brings its lowest hundred keys: when that count equals the window's keys held and
   nothing it shows differs, the look is complete; otherwise the window is read again.
   Between them they show the window's highest hundred keys (the probe orders equal cursor
   values by key, descending) and its lowest, so an insert at either end is seen even where
   a delete in the window cancels it in both counts; one between them with such a delete is
   not (a set without a cursor has the same blind spot in a key range).
3. If the total differs from the keys held, the difference lies in key ranges, each asked
   as `$count=true&$top=100` over `<key> ge a and <key> lt b`. A range that disagrees is
   halved at a held key: one request counts the lower half, the upper half's count is the
   rest of its parent's. The same request brings the lower half's first page, which settles
   its lowest hundred keys (compared key by key: held but gone, deleted; there but not held,
   inserted), so what stays in doubt is the rest, with the rest of the count. A range of two
   pages is asked for its first page alone; a range of at most a hundred records, or one
   cheaper to read than to halve, is read. A range whose count agrees is left alone.
   A set that a small set navigates to (Branches -> Patients, Prescriptions, Claims,
   Appointments: `partition_of`) is first counted per parent in one request
   (`Branches?$expand=Patients($count=true;$top=0)`), and only the cells that differ are
   halved: a delete is searched for among a few hundred records, not the whole set. A key
   missing from its cell is asked for by key before it counts as deleted: it may have moved
   to another parent unseen (a set without `updated_at`), and is then taken as it is now.
4. Rounds repeat until a complete look agrees with the keys held or the budget is spent.
   What is left is reported (`residual`, and `stale` for a window the budget left
   unverified), never silent.
5. Children whose parent was deleted before its page come with no parent's page. They
   share that parent's reference, so `find_children` halves ranges of the reference
   instead of the key, and finds all of one parent's children in one search.
6. A count cannot tell one record missing from one held but deleted: they cancel. Where the
   caller expects records no read brought (`expected_new`, what step 5 did not find) and the
   ranges showed fewer, ranges that agree are halved too, in breadth, until they are found
   or a bounded search is spent; what is not found is reported (`unconfirmed`).

Exact for a set whose records carry `updated_at` as a date-time. A date (Claims) is one
value for a whole day: a second write on the same day to a record, landing on a page the
window's last read had passed, changes no count and waits for the next run (which reads
that day again). With `created_at` only, or no cursor, an update of a record already read
cannot be seen, and a range count cannot tell an insert from a delete in the same range.
A text field without a stated format orders as text, not in time: it is no change cursor
(`EntitySet.change_cursor`). `blind` says what each set cannot see, and README.md ("How a
sync spends its requests") tells operators.
"""

from __future__ import annotations

import json
import logging
import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, Edm, EntitySet, partition_of
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import ApiError
from connectors.clinical_records.keys import entity_key, key_text, to_api
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Comparison, Expand, Expr, Query, all_of, between
from sync.phase import Phase, enter

log = logging.getLogger(__name__)

FUTURE = timedelta(days=1)  # a cursor further ahead than this is a sentinel, not a write
FRUITLESS = 3  # narrowings in a row that find nothing before a difference is left reported


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


def default_budget(total: int) -> int:
    """Requests one set may spend reconciling: twice what reading all of its `total` records
    again costs, and a few. A still source never needs more than one such read (when deletes
    are so many that counting ranges costs more); the second pays for the rounds that follow
    a source that kept changing meanwhile. Only one that changes faster exhausts it."""
    return 30 + 2 * math.ceil(total / PAGE_SIZE)


@dataclass
class Reconciliation:
    """What reconciling one extraction found and cost."""

    caught_up: int = 0  # records written at the source during the run, re-read by cursor
    inserted: int = 0  # keys found in key ranges that the read had passed
    deleted: int = 0  # keys read, then found gone: soft-deleted by the load
    ranges: int = 0  # key ranges counted or re-read
    rounds: int = 0  # probes of the set's total
    requests: int = 0  # requests spent reconciling, the change mark's included
    residual: int = 0  # records by which the total still differed when the budget ran out
    stale: int = 0  # written since the mark and not re-read when the budget ran out (at least)
    unconfirmed: int = 0  # records expected from counts before the read that no range showed
    blind: str = ""  # what this set's reconciliation cannot see

    @property
    def exact(self) -> bool:
        return self.unreconciled == 0

    @property
    def unreconciled(self) -> int:
        """Records by which the set may differ from the source after the run."""
        return self.residual + self.stale + self.unconfirmed

    @property
    def reconciled(self) -> int:
        return self.caught_up + self.inserted + self.deleted

    def figures(self) -> dict[str, int]:
        """The numbers, as run metadata (plotted in the UI) and check metadata name them."""
        named = {f"reconcile_{k}": v for k, v in asdict(self).items() if k != "blind"}
        return {**named, "reconciled": self.reconciled}

    def metadata(self) -> dict[str, Any]:
        return {**self.figures(), "reconcile_blind": self.blind}


def _blind(entity: EntitySet) -> str:
    if entity.sees_updates and entity.field("updated_at").type is Edm.DATE:
        return (
            "updated_at is a date: a second write on the same day to a record, landing on a "
            "page the last read of that day had passed, is seen by the next run"
        )
    if entity.sees_updates:
        return ""
    if entity.change_cursor:
        return "no updated_at: an update during the run is seen by the next snapshot"
    return (
        "no change cursor: updates, and an insert and a delete in one key range, "
        "are seen by the next snapshot"
    )


def _moment(entity: EntitySet, value: Any) -> datetime | None:
    """A cursor value as an instant to order by; None for what is no cursor value."""
    if not isinstance(value, str):
        return None
    try:
        if entity.field(entity.change_cursor).type is Edm.DATE:  # type: ignore[arg-type]
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Reconciler:
    """Reconciles one extraction: `begin` before the read, `read` each page, `finish` after.

    `held` are the keys the warehouse holds live before the run (an increment reads only
    what changed); `take` receives every record re-read, to be written with the batch."""

    def __init__(
        self,
        entity: EntitySet,
        client: ClinicalClient,
        *,
        take: Callable[[list[dict]], None],
        held: Iterable[Any] = (),
    ) -> None:
        self.entity, self.client, self.take = entity, client, take
        self.key, self.cursor = entity.key, entity.change_cursor
        self.held: set[Any] = set(held)
        self.gone: set[Any] = set()
        self.unkeyed = 0  # records without a usable key: counted by the source, not rangeable
        self.mark: tuple[str, datetime] | None = None  # (as sent, as an instant)
        # The window: held keys whose version held was written at or after the mark, each
        # with that version's instant and fingerprint (a probe's record differs or not).
        self.window: dict[Any, tuple[datetime, int]] = {}
        self.window_read = False  # the window was read again since the read
        self.total: int | None = None  # the source's count at the last probe
        self.started_total: int | None = None  # its count when the read began
        self.ceiling = datetime.now(UTC) + FUTURE
        self.result = Reconciliation(blind=_blind(entity))
        self.partition = partition_of(entity)
        self.parents: dict[Any, Any] = {}  # key -> its reference into the partition, as sent
        self.suspects: list[Any] = []  # keys missing from their parent's cell: gone, or moved
        self.probed: list[dict] = []  # the last probe's answer: the mark moves to its newest
        self.window_page: Span | None = None  # the window as last counted, its first page
        self.unverified = 0  # the window's count less its keys held, at its last count

    # -- the three calls ----------------------------------------------------------------------

    def begin(self, *, counted: bool = False) -> None:
        """The change mark, before the read: every later write sorts at or after it. The
        same request counts the set (`started_total`); `counted` asks a set without a
        cursor for its count alone."""
        if self.cursor is None:
            if counted:
                query = Query(self.entity, top=0, count=True)
                self.started_total = int(self._page(query)[COUNT])
            return
        query = Query(
            self.entity,
            select=[self.key, self.cursor],
            orderby=[(self.cursor, True)],
            top=PAGE_SIZE,
            count=True,
        )
        envelope = self._page(query)
        self.started_total = int(envelope[COUNT])
        self._move_mark(envelope["value"])

    def read(self, records: list[dict]) -> None:
        for record in records:
            key = self._key(record)
            if key is None:
                self.unkeyed += 1
            else:
                self.held.add(key)
        self._note(records)

    def finish(self, budget: int | None = None, *, expected_new: int = 0) -> Reconciliation:
        """Probe, and chase differences through key ranges, until the total agrees or
        `budget` requests are spent (default: `default_budget` of the source's total).
        `expected_new`: records the source held before the read that no read brought (the
        caller's counts say so); the ranges are searched for them even where the total agrees."""
        enter(Phase.RECONCILE, self.entity.name)
        result = self.result
        fruitless = 0  # narrowings in a row that found nothing (drift moved the counts?)
        inserted_before = result.inserted  # a caller's own search (find_children) came first
        searched = False
        while True:
            result.rounds += 1
            before = (len(self.held), len(self.gone), result.caught_up)
            self.total, complete = self._probe()
            if budget is None:
                budget = default_budget(self.total)
            if not complete and not (self._window_agrees() and self.window_read):
                if result.requests >= budget:
                    result.stale = max(1, self.unverified)
                    result.residual = abs(self.total - (len(self.held) + self.unkeyed))
                    log.warning(
                        "%s: more was written since the run's mark than one request shows, "
                        "and the budget (%d requests) ran out before it could be read again: "
                        "at least %d records may be stale; the next run reads them",
                        self.entity.name,
                        budget,
                        result.stale,
                    )
                    break
                self._catch_up()
                continue  # requests followed the probe: the last look is yet to come
            self._move_mark(self.probed)
            difference = self.total - (len(self.held) + self.unkeyed)
            short = expected_new - (result.inserted - inserted_before)
            if difference == 0 and short > 0 and not searched and result.requests < budget:
                searched = True
                if self._narrow(self.total, budget, search=short):
                    expected_new = 0  # the set was read whole: nothing else is missing
                continue
            if difference == 0:
                result.residual = 0
                result.unconfirmed = max(0, short)
                if short > 0:
                    log.warning(
                        "%s: counts before the read promised %d records no read brought, and "
                        "no key range shows them: deleted before their parent's page, or hidden "
                        "in the count by as many deletes",
                        self.entity.name,
                        short,
                    )
                break
            if result.requests >= budget:
                result.residual = abs(difference)
                log.warning(
                    "%s: the source changed faster than reconciliation could follow: its count "
                    "still differs by %d after %d extra requests (budget %d); the next run "
                    "starts from what was committed",
                    self.entity.name,
                    abs(difference),
                    result.requests,
                    budget,
                )
                break
            self._narrow(self.total, budget)
            found = (len(self.held), len(self.gone), result.caught_up) != before
            fruitless = 0 if found else fruitless + 1
            if fruitless >= FRUITLESS:
                result.residual = abs(difference)
                log.warning(
                    "%s: the source's count differs by %d from the keys held, and no key range "
                    "shows where (keys the service orders otherwise?)",
                    self.entity.name,
                    abs(difference),
                )
                break
        return result

    def forget(self, keys: Iterable[Any]) -> None:
        """Keys known gone without a probe (children missing from a parent read whole)."""
        gone = set(keys)
        self.held.difference_update(gone)
        self.gone.update(gone)
        self.result.deleted = len(self.gone)

    def deleted_keys(self) -> list[str]:
        """Keys read, then found gone at the source, as text (the lake's form)."""
        return sorted(str(k) for k in self.gone)

    # -- probes -------------------------------------------------------------------------------

    def _probe(self) -> tuple[int, bool]:
        """One request: the source's total now, and its writes since the mark; those that
        differ from the version held are re-read. True when the answer holds every write
        since the mark (then it is a complete look at one moment)."""
        if self.cursor is None:
            query = Query(self.entity, orderby=[(self.key, True)], top=PAGE_SIZE, count=True)
            envelope = self._page(query)
            total = int(envelope[COUNT])
            newest = envelope["value"]
            if len(newest) >= total:  # the whole set, at one moment
                self._settle(sorted(self.held), newest)
            elif (lowest := self._key(newest[-1]) if newest else None) is not None:
                # The highest hundred keys, at one moment, where a service that numbers its
                # records puts new ones: inserts there, and deletes among them, are settled
                # here instead of by halving key ranges.
                self._settle(sorted(k for k in self.held if k >= lowest), newest)
            return total, True
        # Among writes that share a cursor value (a date), the highest keys first, where a
        # service numbers new records; the window's count brings the lowest.
        query = Query(
            self.entity,
            orderby=[(self.cursor, True), (self.key, True)],
            top=PAGE_SIZE,
            count=True,
        )
        envelope = self._page(query)
        newest = self.probed = envelope["value"]
        self._reread([r for r in newest if self._since_mark(r)])
        complete = len(newest) < PAGE_SIZE or self.mark is None
        return int(envelope[COUNT]), complete or not self._in_window(newest[-1])

    def _window_agrees(self) -> bool:
        """One request: how many records lie at or after the mark now, and the lowest
        hundred keys of them (the first page of reading the window again). True when that
        count equals the window's keys held and none of those shown differs from the
        version held."""
        assert self.mark is not None and self.cursor is not None
        window = Comparison(self.cursor, "ge", self.mark[0])
        self.window_page = Span(None, None, [], 0, where=window)
        query = Query(
            self.entity, filter=window, orderby=[(self.key, False)], top=PAGE_SIZE, count=True
        )
        envelope = self._page(query)
        self.window_page.first = envelope["value"]
        changed = self._reread(envelope["value"])
        held = sum(1 for k, (moment, _) in self.window.items() if k in self.held)
        self.unverified = abs(int(envelope[COUNT]) - held)
        return not changed and self.unverified == 0

    def _catch_up(self) -> None:
        """The window read again, on from the page that counted it (keyset pages, which no
        shift between them can skip): what differs is re-read. A held key of the window
        the read did not bring is asked for by key (its cursor only moves up, so it was
        deleted, unless the service says otherwise). Then the mark moves to the newest the
        probe saw: every later write sorts at or after it."""
        span = self.window_page
        assert span is not None and span.first is not None
        records = self._read_on(span.first, span)
        self._reread(records)
        there = {self._key(r) for r in records}
        self.suspects.extend(k for k in self.window if k in self.held and k not in there)
        self._confirm()
        self.window_read = True
        self._move_mark(self.probed)

    def _since_mark(self, record: dict) -> bool:
        if self.mark is None:
            return True
        moment = _moment(self.entity, record.get(self.cursor))
        return moment is None or moment >= self.mark[1]

    def _in_window(self, record: dict) -> bool:
        moment = _moment(self.entity, record.get(self.cursor))
        return self.mark is not None and moment is not None and moment >= self.mark[1]

    def _move_mark(self, records: list[dict]) -> None:
        """The newest cursor value that is no sentinel from the future; the window keeps
        what lies at or after it."""
        for record in records:
            value = record.get(self.cursor)
            moment = _moment(self.entity, value)
            if moment is None or moment > self.ceiling:
                continue
            if self.mark is None or moment > self.mark[1]:
                self.mark = (value, moment)
        if self.mark is not None:
            mark = self.mark[1]
            self.window = {k: v for k, v in self.window.items() if v[0] >= mark}

    def _reread(self, records: list[dict]) -> list[dict]:
        """Records written since the mark: those whose version differs from the one held
        (or not held at all) go into the batch; returned."""
        changed = [r for r in records if self._differs(r)]
        for record in changed:
            key = self._key(record)
            self.held.add(key)
            self.gone.discard(key)
        self.result.caught_up += len(changed)
        self._give(changed)
        return changed

    def _differs(self, record: dict) -> bool:
        key = self._key(record)
        if key is None:  # nothing to compare by: normalise rejects it, as the read did
            return False
        held = self.window.get(key) if key in self.held else None
        return held is None or held[1] != _fingerprint(record)

    # -- children of a parent deleted before its page ---------------------------------------

    def find_children(
        self, ref: str, refs: list[Any], expected: int, parents: set[str | None]
    ) -> list[dict]:
        """Records no read brought whose parent was deleted before its page: they share that
        parent's reference, so ranges of `ref` (not of the key) are halved, following those
        that count more records than the `refs` held in them, and all of one parent's
        children turn up in one search. `refs`: the sorted references of the records held;
        `parents`: the parents read (`key_text`): a record found under one of them is new
        (written during the run), taken but not one of the `expected`. Returns the records
        found (not yet taken); bounded by `search_cost`."""
        found: list[dict] = []
        if not refs or expected <= 0:
            return found
        start, limit = self.result.requests, search_cost(expected, len(refs) + expected)
        # (low, high, i, j, count): a range of `ref`, its held refs[i:j], the source's count
        # (None: not known, for the whole: both halves are then asked)
        pending: deque[tuple[Any, Any, int, int, int | None]] = deque(
            [(None, None, 0, len(refs), None)]
        )

        def follow(low: Any, high: Any, i: int, j: int, count: int | None) -> None:
            if count is not None and count > j - i:  # more there than held: some not read
                pending.append((low, high, i, j, count))

        def orphans() -> int:
            return sum(key_text(r.get(ref)) not in parents for r in found)

        while pending and orphans() < expected and self.result.requests - start < limit:
            low, high, i, j, count = pending.popleft()
            middle = _split(refs, i, j)
            if middle is None:  # one reference only: its children are read
                self._children(ref, low, high, found, whole=True)
                continue
            lower = self._children(ref, low, refs[middle], found)
            if lower is None:  # settled: its count, for the upper's, is what came back
                lower = middle - i + sum(1 for r in found if _within(r.get(ref), low, refs[middle]))
            else:
                follow(low, refs[middle], i, middle, lower)
            if count is None:
                follow(
                    refs[middle], high, middle, j, self._children(ref, refs[middle], high, found)
                )
            else:
                follow(refs[middle], high, middle, j, count - lower)
        self.result.inserted += len(found)
        return found

    def _children(
        self, ref: str, low: Any, high: Any, found: list[dict], whole: bool = False
    ) -> int | None:
        """One request counts the records whose `ref` lies in [low, high); a range of at
        most a page comes back whole with it, and one `whole` is read: their records not
        held join `found`, and None is returned, for the range is settled."""
        condition = between(ref, low, high)
        self.result.ranges += 1
        if whole:
            records = list(self._all(Query(self.entity, filter=condition)))
        else:
            orderby = [(ref, False), (self.key, False)]
            query = Query(self.entity, filter=condition, orderby=orderby, top=PAGE_SIZE, count=True)
            envelope = self._page(query)
            count, records = int(envelope[COUNT]), envelope["value"]
            if len(records) < count:
                return count
        seen = {self._key(r) for r in found}
        for record in records:
            if (key := self._key(record)) not in self.held and key not in seen:
                found.append(record)
                seen.add(key)
        return None

    # -- key ranges ---------------------------------------------------------------------------

    def _narrow(self, total: int, budget: int, search: int = 0) -> bool:
        """Find where the source's `total` and the held keys differ by halving key ranges: a
        half's count comes from one request, the other half's is the rest of its parent's.
        Every count also brings the range's first page, which settles its lowest hundred
        keys: a range of two pages costs one request, and a second only where the
        difference lies past its first page. A set a small set navigates to is first
        counted per parent of it (`_cells`), and only the cells that differ are halved.
        `search`: records missing although counts may agree (a delete cancels each); ranges
        that agree are halved too, widest first, until as many are found or `search_cost`
        requests are spent (a set that costs no more to read is read: then True)."""
        ordered = sorted(self.held)
        whole = Span(None, None, ordered, total)
        pending: deque[Span] = deque([whole])
        agreeing: deque[Span] = deque()
        found_before = self.result.inserted
        cost = search_cost(search, total)
        if cost >= math.ceil(total / PAGE_SIZE):  # reading it all is surer, and no dearer
            first = self._range_page(whole)
            self._settle(ordered, self._read_on(first["value"], whole))
            return True
        if not search and (cells := self._cells(whole)) is not None:
            pending = deque(cells)
        limit = min(budget, self.result.requests + cost)
        while self.result.requests < budget:
            if pending:
                span = pending.popleft()
                if span.first is not None:  # its lowest keys are known: settle them
                    if rest := self._past_first(span):
                        pending.appendleft(rest)
                    continue
                if span.count == span.held:
                    if search and span.count:
                        agreeing.append(span)
                    continue
            elif agreeing and self.result.inserted - found_before < search:
                if self.result.requests >= limit:
                    break
                span = agreeing.popleft()
            else:
                break
            pages = math.ceil(max(span.count, span.held) / PAGE_SIZE)
            differ = abs(span.count - span.held)
            if span.held < 2 or pages <= 1 or (differ > 1 and pages <= differ * math.log2(pages)):
                first = self._range_page(span)
                records = self._read_on(first["value"], span)
                self._settle(span.keys, records, cell=span.where is not None)
                continue
            if pages == 2:  # its first page settles half of it, and counts the rest
                first = self._range_page(span)
                span.count, span.first = int(first[COUNT]), first["value"]
                pending.appendleft(span)
                continue
            middle = len(span.keys) // 2
            lower = replace(span, high=span.keys[middle], keys=span.keys[:middle])
            first = self._range_page(lower)
            lower.count, lower.first = int(first[COUNT]), first["value"]
            pending.append(lower)
            upper = replace(span, low=span.keys[middle], keys=span.keys[middle:], past=False)
            pending.append(replace(upper, count=span.count - lower.count))
        self._confirm()
        return False

    def _confirm(self) -> None:
        """Keys missing from their parent's cell, each asked for by key: gone (404), or
        moved to another parent unseen, then taken as they are now."""
        keys, self.suspects = self.suspects, []
        if not keys:
            return
        before = self.client.stats.requests
        try:
            found = list(self.client.by_key(self.entity, keys))
        finally:
            self.result.requests += self.client.stats.requests - before
        moved = [record for record in found if record is not None]
        self.gone.update(key for key, record in zip(keys, found, strict=True) if record is None)
        self.held.difference_update(self.gone)
        self.gone.difference_update(self._key(record) for record in moved)
        self.result.deleted = len(self.gone)
        self._give(moved)

    def _cells(self, whole: Span) -> list[Span] | None:
        """The set counted per parent in its small partitioning set, in one request
        (`Branches?$expand=Patients($count=true;$top=0)`): a span per cell whose count
        differs from its held keys, the records with no parent one cell of their own. None
        where it cannot help: no such set, parents past one page, or keys held without
        their parent (an increment's)."""
        if self.partition is None or not self.held <= self.parents.keys():
            return None
        small, navigation = self.partition
        remote = navigation.remote
        query = Query(
            small,
            select=[small.key],
            orderby=[(small.key, False)],
            top=PAGE_SIZE,
            count=True,
            expand=[Expand(navigation.name, top=0, count=True)],
        )
        try:
            envelope = self._page(query)
        except ApiError as refused:
            if refused.status != 400:
                raise
            log.info(
                "%s: the service refused counts per %s; searching key ranges alone",
                self.entity.name,
                small.name,
            )
            self.partition = None
            return None
        parents = envelope["value"]
        if int(envelope[COUNT]) > len(parents):
            return None
        reference = self.entity.field(remote)
        by_parent: dict[Any, list[Any]] = {}
        for key in whole.keys:
            sent = self.parents[key]
            parent = None if sent is None else to_api(reference, sent)
            if sent is not None and parent is None:  # a reference no filter can name
                return None
            by_parent.setdefault(parent, []).append(key)
        cells, counted = [], 0
        for record in parents:
            count = int(record.get(f"{navigation.name}{COUNT}", 0))
            parent = to_api(reference, record.get(small.key))
            keys = by_parent.pop(parent, [])
            counted += count
            if parent is not None and count != len(keys):
                where = Comparison(remote, "eq", parent)
                cells.append(Span(None, None, keys, count, where=where))
        orphaned = by_parent.pop(None, [])
        if by_parent:  # held under a parent the small set does not have
            return None
        if whole.count - counted != len(orphaned):
            where = Comparison(remote, "eq", None)
            cells.append(Span(None, None, orphaned, whole.count - counted, where=where))
        return cells

    def _past_first(self, span: Span) -> Span | None:
        """Settle a span's keys up to the last of its first page; what lies past it remains
        (None: nothing does), its count the rest of the span's."""
        first = span.first or []
        cell = span.where is not None
        if len(first) >= span.count:  # the whole span came back
            self._settle(span.keys, first, cell=cell)
            return None
        last = self._key(first[-1])
        if last is None:  # nothing to settle by: the span stands as counted
            return replace(span, first=None)
        upto = bisect_right(span.keys, last)
        self._settle(span.keys[:upto], first, cell=cell)
        rest = span.count - len(first)
        return replace(span, low=last, keys=span.keys[upto:], count=rest, first=None, past=True)

    def _range_page(self, span: Span) -> dict[str, Any]:
        """One request: a span's count and its first page."""
        self.result.ranges += 1
        return self._page(
            Query(
                self.entity,
                filter=self._range(span.low, span.high, past=span.past, where=span.where),
                orderby=[(self.key, False)],
                top=PAGE_SIZE,
                count=True,
            )
        )

    def _read_on(self, records: list[dict], span: Span) -> list[dict]:
        """A span whose first page is `records`, read on by keyset pages to its end."""
        page = records
        while len(page) >= PAGE_SIZE:
            last = self._key(page[-1])
            if last is None:
                break
            envelope = self._page(
                Query(
                    self.entity,
                    filter=self._range(last, span.high, past=True, where=span.where),
                    orderby=[(self.key, False)],
                    top=PAGE_SIZE,
                )
            )
            page = envelope["value"]
            records = records + page
        return records

    def _range(
        self, low: Any, high: Any, *, past: bool = False, where: Expr | None = None
    ) -> Expr | None:
        return all_of(where, between(self.key, low, high, past=past))

    def _settle(self, held_here: list[Any], records: list[dict], *, cell: bool = False) -> None:
        """`records` are a key range as it stands: held keys missing from it are gone, or,
        in a `cell`, suspects: they may have moved to another parent unseen (`_confirm`)."""
        there = {k for k in map(self._key, records) if k is not None}
        gone = [k for k in held_here if k not in there]
        if cell:
            self.suspects.extend(gone)
            gone = []
        new = there - self.held
        self.held.difference_update(gone)
        self.gone.update(gone)
        self.gone.difference_update(there)
        self.held.update(there)
        self.result.deleted = len(self.gone)
        self.result.inserted += len(new)
        self._give(records)

    def _give(self, records: list[dict]) -> None:
        """Records re-read, to be written with the batch."""
        self._note(records)
        if records:
            self.take(records)

    def _note(self, records: list[dict]) -> None:
        """What the records tell of the keys held: the version of those in the window, the
        parent of each where the set has a partition."""
        for record in records:
            if (key := self._key(record)) is None:
                continue
            if self.cursor is not None:
                moment = _moment(self.entity, record.get(self.cursor))
                if moment is not None and (self.mark is None or moment >= self.mark[1]):
                    self.window[key] = (moment, _fingerprint(record))
                else:
                    self.window.pop(key, None)
            if self.partition is not None:
                self.parents[key] = record.get(self.partition[1].remote)

    # -- requests -----------------------------------------------------------------------------

    def _page(self, query: Query) -> dict[str, Any]:
        before = self.client.stats.requests
        try:
            return self.client.page(query.entity, query)
        finally:
            self.result.requests += self.client.stats.requests - before

    def _all(self, query: Query) -> Iterator[dict]:
        before = self.client.stats.requests
        try:
            for page in self.client.iter_pages(self.entity, query):
                yield from page.records
        finally:
            self.result.requests += self.client.stats.requests - before

    def _key(self, record: dict) -> Any:
        return entity_key(self.entity, record.get(self.key))


def _fingerprint(record: dict) -> int:
    """One version of a record, to tell it from another (annotations aside)."""
    fields = {k: v for k, v in record.items() if not k.startswith("@")}
    return hash(json.dumps(fields, sort_keys=True, default=str))


def _split(refs: list[Any], i: int, j: int) -> int | None:
    """An index in (i, j) where the sorted `refs` change value, nearest their middle (a
    range boundary must not cut one reference's records in two); None if all are equal."""
    middle = (i + j) // 2
    after, before = bisect_right(refs, refs[middle], i, j), bisect_left(refs, refs[middle], i, j)
    choices = [m for m in (before, after) if i < m < j]
    return min(choices, key=lambda m: abs(m - middle)) if choices else None


def _within(value: Any, low: Any, high: Any) -> bool:
    return value is not None and (low is None or value >= low) and (high is None or value < high)


def held_from(entity: EntitySet, keys: Iterable[Any]) -> set[Any]:
    """Warehouse keys (canonical types) in the kind the API sends them (keys.to_api)."""
    found = (entity_key(entity, v) for v in keys)
    return {k for k in found if k is not None}
