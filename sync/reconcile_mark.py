"""The change mark and the probe: what was written during the read, re-read.

1. Before the read, the change mark: the newest value of the set's change cursor
   (`$orderby=<cursor> desc`). Every write after it carries a cursor at or after it.
2. After the read, each round starts with one probe: `$count=true&$top=100&$orderby=<cursor>
   desc` answers, at one moment, the set's total and its newest writes. Those at or after
   the mark that differ from the version held are re-read into the batch, and the mark
   moves up to the newest the probe saw. A set without a cursor probes `$orderby=<key>
   desc`: a set of at most a hundred records comes back whole and is compared key by key;
   a larger one has its highest hundred keys (where new records get their numbers) compared.

**The run's last look at a set comes after every other request to it.** A probe that holds
every write since the mark (fewer than a hundred) is such a look. One whose hundred all lie
there (a date cursor: the whole day shares one value) cannot show the rest: the records at or
after the mark (the window) are read again (`<cursor> ge <mark>`), and since that read is no
look at one moment (a write may land on a page it has passed), the probe is asked again,
followed by one request that counts the window and brings its lowest hundred keys: when that
count equals the window's keys held and nothing it shows differs, the look is complete;
otherwise the window is read again. Between them they show the window's highest hundred keys
(the probe orders equal cursor values by key, descending) and its lowest, so an insert at
either end is seen even where a delete in the window cancels it in both counts.

Two requests are no look at one moment, and no order of them closes that: the total and
the window's count are two numbers no single answer gives, and whichever is asked first
misses what changes only it before the other is answered (the probe first: a delete of a
record older than the window; the count first: a record's first write of the day, below
the probe's hundred). The probe comes first because updates are the commonest write and the
count shows every one of them. So a date-cursor set whose window outgrew a page declares
what its last look cannot see (`Blind.DAY_PAIRS`): such a delete between the two requests,
and an insert the two pages do not show cancelled in both counts by a delete in the window.
The next run, whose window holds that day, sees either. A set without a cursor has the same
blind spot in a key range (`Blind.PAIRS`).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, Edm, EntitySet
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Comparison, Query
from sync.reconcile_ledger import Ledger, fingerprint
from sync.reconcile_ranges import Span, counted_page, read_on
from sync.reconcile_source import Source

SENTINEL_AHEAD = timedelta(days=1)  # a cursor further ahead than this is a sentinel, no write


def cursor_instant(entity: EntitySet, value: Any) -> datetime | None:
    """A change cursor's value as an instant to order by; None for what is no such value."""
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


class Blind(StrEnum):
    """What a set's reconciliation cannot see during the run: it is seen by the next one."""

    SAME_DAY = (
        "updated_at is a date: a second write on the same day to a record, landing on a page "
        "the last read of that day had passed"
    )
    UPDATES = "no updated_at: an update during the run"
    PAIRS = "no change cursor: an insert and a delete in one key range"
    DAY_PAIRS = (
        "more than a hundred records carry the last day, more than one answer shows: a "
        "delete between its last two requests, or an insert among them that a delete "
        "cancels in every count"
    )


def blind_to(entity: EntitySet, whole: bool = False, split: bool = False) -> frozenset[Blind]:
    """The changes this set's reconciliation cannot see (a count cannot tell an insert from
    a delete it cancels; only a change cursor shows an insert or an update by itself).
    `whole`: its last look brought the whole set in one answer, which hides nothing;
    `split`: it needed the window's count beside the probe (no answer held every write)."""
    if whole:
        return frozenset()
    if entity.sees_updates:
        if entity.field("updated_at").type is not Edm.DATE:
            return frozenset()
        return frozenset({Blind.SAME_DAY, Blind.DAY_PAIRS} if split else {Blind.SAME_DAY})
    if entity.change_cursor:
        return frozenset({Blind.UPDATES})
    return frozenset({Blind.UPDATES, Blind.PAIRS})


def blind_spot(blind: frozenset[Blind]) -> str:
    """`blind_to`'s answer as an operator reads it (`Reconciliation.blind`)."""
    if not blind:
        return ""
    return "; ".join(b.value for b in Blind if b in blind) + ": seen by the next run"


class ChangeMark:
    """One set's change mark, its window (held keys written at or after the mark, each with
    that version's instant and fingerprint), and the probes that look at the set."""

    def __init__(self, source: Source, ledger: Ledger) -> None:
        self.source, self.ledger, self.entity = source, ledger, source.entity
        self.key, self.cursor = self.entity.key, self.entity.change_cursor
        self.mark: tuple[str, datetime] | None = None  # (as sent, as an instant)
        self.window: dict[Any, tuple[datetime, int]] = {}
        self.window_read = False  # the window was read again since the read
        self.window_page: Span | None = None  # the window as last counted, its first page
        self.unverified = 0  # the window's count less its keys held, at its last count
        self.started_total: int | None = None  # the source's count when the read began
        self.probed: list[dict] = []  # the last probe's answer: the mark moves to its newest
        self.whole = False  # the last probe's answer held the whole set: it hides nothing
        self.split = False  # the last probe did not hold every write since the mark
        self.ceiling = datetime.now(UTC) + SENTINEL_AHEAD
        ledger.watchers.append(self._note_versions)
        ledger.knowers.append(self._known)

    def begin(self, *, counted: bool = False) -> None:
        """The change mark, before the read: every later write sorts at or after it. The
        same request counts the set (`started_total`); `counted` asks a set without a
        cursor for its count alone."""
        if self.cursor is None:
            if counted:
                query = Query(self.entity, top=0, count=True)
                self.started_total = int(self.source.page(query)[COUNT])
            return
        query = Query(
            self.entity,
            select=[self.key, self.cursor],
            orderby=[(self.cursor, True)],
            top=PAGE_SIZE,
            count=True,
        )
        envelope = self.source.page(query)
        self.started_total = int(envelope[COUNT])
        self.move(envelope["value"])

    def probe(self) -> tuple[int, bool]:
        """One request: the source's total now, and its writes since the mark; those that
        differ from the version held are re-read. True when the answer holds every write
        since the mark (then it is a complete look at one moment)."""
        if self.cursor is None:
            return self._probe_highest_keys(), True
        # Among writes that share a cursor value (a date), the highest keys first, where a
        # service numbers new records; the window's count brings the lowest.
        query = Query(
            self.entity,
            orderby=[(self.cursor, True), (self.key, True)],
            top=PAGE_SIZE,
            count=True,
        )
        envelope = self.source.page(query)
        newest = self.probed = envelope["value"]
        self.whole = len(newest) >= int(envelope[COUNT])
        self._reread([r for r in newest if self._since_mark(r)])
        complete = len(newest) < PAGE_SIZE or self.mark is None
        self.split = not complete and self._in_window(newest[-1])
        return int(envelope[COUNT]), not self.split

    def window_agrees(self) -> bool:
        """One request: how many records lie at or after the mark now, and the lowest
        hundred keys of them (the first page of reading the window again). True when that
        count equals the window's keys held and none of those shown differs from the
        version held."""
        assert self.mark is not None and self.cursor is not None
        window = Comparison(self.cursor, "ge", self.mark[0])
        envelope = counted_page(self.source, window)
        changed = self._reread(envelope["value"])
        held = sorted(k for k in self.window if k in self.ledger.held)
        count = int(envelope[COUNT])
        self.window_page = Span(None, None, held, count, first=envelope["value"], where=window)
        self.unverified = abs(count - len(held))
        return not changed and self.unverified == 0

    def catch_up(self) -> None:
        """The window read again, on from the page that counted it (keyset pages, which no
        shift between them can skip): what differs is re-read. A held key of the window
        the read did not bring is asked for by key (its cursor only moves up, so it was
        deleted, unless the service says otherwise). Then the mark moves to the newest the
        probe saw: every later write sorts at or after it."""
        span = self.window_page
        assert span is not None and span.first is not None
        records = read_on(self.source, self.ledger, span)
        self._reread(records)
        there = {self.ledger.key(r) for r in records}
        held = self.ledger.held
        self.ledger.suspect(k for k in self.window if k in held and k not in there)
        self.ledger.confirm(self.source)
        self.window_read = True
        self.move(self.probed)

    def move(self, records: list[dict]) -> None:
        """The mark to the newest cursor value that is no sentinel from the future; the
        window keeps what lies at or after it."""
        for record in records:
            value = record.get(self.cursor)
            moment = cursor_instant(self.entity, value)
            if moment is None or moment > self.ceiling:
                continue
            if self.mark is None or moment > self.mark[1]:
                self.mark = (value, moment)
        if self.mark is not None:
            mark = self.mark[1]
            self.window = {k: v for k, v in self.window.items() if v[0] >= mark}

    def _probe_highest_keys(self) -> int:
        """A set without a cursor: its total, and its highest hundred keys at one moment,
        where a service that numbers its records puts new ones: inserts there, and deletes
        among them, are settled here instead of by halving key ranges (a set of at most a
        hundred comes back whole)."""
        query = Query(self.entity, orderby=[(self.key, True)], top=PAGE_SIZE, count=True)
        envelope = self.source.page(query)
        total = int(envelope[COUNT])
        newest = envelope["value"]
        held = self.ledger.held
        self.whole = len(newest) >= total
        if self.whole:  # the whole set, at one moment
            self.ledger.settle_range(sorted(held), newest)
        elif (lowest := self.ledger.key(newest[-1]) if newest else None) is not None:
            self.ledger.settle_range(sorted(k for k in held if k >= lowest), newest)
        return total

    def _reread(self, records: list[dict]) -> list[dict]:
        """Records written since the mark: those whose version differs from the one held
        (or not held at all) go into the batch; returned."""
        changed = [r for r in records if self._differs(r)]
        self.ledger.rewritten(changed)
        return changed

    def _differs(self, record: dict) -> bool:
        key = self.ledger.key(record)
        if key is None:  # nothing to compare by: normalise rejects it, as the read did
            return False
        held = self.window.get(key) if key in self.ledger.held else None
        return held is None or held[1] != fingerprint(record)

    def _known(self, record: dict) -> bool:
        """A version the batch has: noted at or after the mark (the read's, or re-read), or
        older than the mark in a set whose every write moves its cursor (the version read)."""
        if self.cursor is None or (key := self.ledger.key(record)) is None:
            return False
        if key in self.window:
            return self.window[key][1] == fingerprint(record)
        return self.entity.sees_updates and key in self.ledger.held and not self._since_mark(record)

    def _since_mark(self, record: dict) -> bool:
        if self.mark is None:
            return True
        moment = cursor_instant(self.entity, record.get(self.cursor))
        return moment is None or moment >= self.mark[1]

    def _in_window(self, record: dict) -> bool:
        moment = cursor_instant(self.entity, record.get(self.cursor))
        return self.mark is not None and moment is not None and moment >= self.mark[1]

    def _note_versions(self, records: list[dict]) -> None:
        """The version of each record at or after the mark, to tell a later one from it."""
        if self.cursor is None:
            return
        for record in records:
            if (key := self.ledger.key(record)) is None:
                continue
            moment = cursor_instant(self.entity, record.get(self.cursor))
            if moment is not None and (self.mark is None or moment >= self.mark[1]):
                self.window[key] = (moment, fingerprint(record))
            else:
                self.window.pop(key, None)
