"""Reconciliation: an extraction ends equal to the source as it stands when it ends.

Paging reads every record that stays put (connectors/clinical_records/paging.py). A source
that changes while it is read leaves three differences behind: an insert whose key sorts
before keys already read, an update of a record already read, and a delete of one. They
are found at the cost of a few requests, each job in a module of its own:

- `reconcile_mark.py`: the change mark before the read; after it, rounds that each start
  with one probe (the set's total and its newest writes at one moment): what was written
  since the mark is re-read, and the run's last look at a set comes after every other
  request to it.
- `reconcile_ranges.py`: if the total differs from the keys held, the difference lies in
  key ranges, counted and halved (each count's request brings the range's first page).
- `reconcile_cells.py`: a set a small set navigates to is first counted per parent in one
  request; only the cells that differ are halved.
- `reconcile_children.py`: children whose parent was deleted before its page come with no
  parent's page; `find_children` halves ranges of their reference instead of the key.
- `reconcile_ledger.py`: the keys held and gone, and every count of what changed.
- `reconcile_source.py`: what the jobs ask the service, and the one place that counts it.

This module runs them: rounds until a complete look agrees with the keys held or the budget
is spent; what is left is reported (`residual`; `stale`, a window left unverified), never
silent. A count cannot tell one record missing from one held but deleted: they cancel. The
records a caller expects that no read brought (`expected_new`) are searched for where the
count agrees, within a bound; what is not found is reported (`unconfirmed`).

Exact for a set whose records carry `updated_at` as a date-time. A date (Claims) is one
value for a whole day: a second write on the same day to a record, landing on a page the
window's last read had passed, changes no count and waits for the next run (which reads
that day again). With `created_at` only, or no cursor, an update of a record already read
cannot be seen, and a range count cannot tell an insert from a delete in the same range.
A text field without a stated format orders as text, not in time: it is no change cursor
(`EntitySet.change_cursor`). `blind` says what each set cannot see, and docs/sync.md tells
operators.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.keys import entity_key
from sync.exactness import LastLook, Looking
from sync.phase import Phase, enter
from sync.reconcile_cells import ParentCells
from sync.reconcile_children import ChildrenByReference
from sync.reconcile_ledger import Ledger
from sync.reconcile_mark import ChangeMark, blind_spot, blind_to
from sync.reconcile_ranges import KeyRanges, search_cost
from sync.reconcile_ranges import Span as Span  # callers import it from here
from sync.reconcile_source import ClientSource, Source
from warehouse.figures import Figure

log = logging.getLogger(__name__)

FRUITLESS_NARROWINGS = 3  # narrowings in a row that find nothing: the difference is reported


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
    blind_to: frozenset[str] = frozenset()  # the same, as `reconcile_mark.Blind` names
    parent_counts_refused: bool = False  # the service answered counts per parent with a 400

    @property
    def exact(self) -> bool:
        return self.unreconciled == 0

    @property
    def unreconciled(self) -> int:
        """Records by which the set differs from the source after the run, at least: a
        source that changes between any two requests can hide as many inserts as deletes in
        every count a run holds, so no figure bounds it from above (docs/reliability.md)."""
        return self.residual + self.stale + self.unconfirmed

    @property
    def reconciled(self) -> int:
        return self.caught_up + self.inserted + self.deleted

    def figures(self) -> dict[str, int]:
        """The numbers, as run metadata (plotted in the UI) and check metadata name them."""
        words = ("blind", "blind_to", "parent_counts_refused")
        named = {f"reconcile_{k}": v for k, v in asdict(self).items() if k not in words}
        return {**named, Figure.RECONCILED: self.reconciled}

    def metadata(self) -> dict[str, Any]:
        return {**self.figures(), "reconcile_blind": self.blind}


class Stop(Enum):
    """Why the rounds of one reconciliation ended."""

    AGREES = "a complete look agrees with the keys held"
    WINDOW_UNREAD = "the budget ran out before the window since the mark was read again"
    BUDGET_SPENT = "the budget ran out with the count still differing"
    NOTHING_FOUND = "narrowing found nothing, rounds in a row"


class Reconciler:
    """Reconciles one extraction: `begin` before the read, `read` each page, `finish` after.

    `held` are the keys the warehouse holds live before the run (an increment reads only
    what changed); `to_batch` receives every record re-read, to be written with the batch.
    `source`: what is asked instead of `client` (tests: an in-memory list of records)."""

    def __init__(
        self,
        entity: EntitySet,
        client: ClinicalClient | None = None,
        *,
        to_batch: Callable[[list[dict]], None],
        held: Iterable[Any] = (),
        source: Source | None = None,
    ) -> None:
        if source is None:
            if client is None:
                raise TypeError("Reconciler needs a client or a source to ask")
            source = ClientSource(client, entity)
        self.entity = entity
        self.ledger = Ledger(entity, to_batch, held)
        self.source = source = Looking(source, self.ledger)  # every answer is a look
        self.mark = ChangeMark(source, self.ledger)
        self.cells = ParentCells(source, self.ledger)
        self.ranges = KeyRanges(source, self.ledger, self.cells.split)
        self.children = ChildrenByReference(source, self.ledger)
        self.total: int | None = None  # the source's count at the last probe
        self.budget: int | None = None
        self.rounds = 0
        self.residual = self.stale = self.unconfirmed = 0
        self.last_look: LastLook | None = None  # the round that settled the set, if one did

    @property
    def held(self) -> set[Any]:
        return self.ledger.held

    @property
    def started_total(self) -> int | None:
        """The source's count when the read began (`begin`)."""
        return self.mark.started_total

    @property
    def result(self) -> Reconciliation:
        """What reconciling has found and cost so far, as the jobs count it."""
        blind = blind_to(self.entity, self.mark.whole, self.mark.split)
        return Reconciliation(
            caught_up=self.ledger.caught_up,
            inserted=self.ledger.inserted,
            deleted=self.ledger.deleted,
            ranges=self.ranges.ranges + self.children.ranges,
            rounds=self.rounds,
            requests=self.source.requests,
            residual=self.residual,
            stale=self.stale,
            unconfirmed=self.unconfirmed,
            blind=blind_spot(blind),
            blind_to=frozenset(b.name for b in blind),
            parent_counts_refused=self.cells.refused,
        )

    def begin(self, *, counted: bool = False) -> None:
        """The change mark, before the read (`ChangeMark.begin`)."""
        self.mark.begin(counted=counted)

    def resume(self, mark: str | None) -> None:
        """Look at the set again from an earlier reconciliation's change mark (`saved_mark`):
        what was written since is re-read (sync/settle.py)."""
        if mark is not None and self.entity.change_cursor is not None:
            self.mark.move([{self.entity.change_cursor: mark}])

    @property
    def saved_mark(self) -> str | None:
        """The change mark as sent (None: no cursor, or none seen)."""
        return self.mark.mark[0] if self.mark.mark is not None else None

    def read(self, records: list[dict]) -> None:
        self.ledger.read(records)

    def forget(self, keys: Iterable[Any]) -> None:
        """Keys known gone without a probe (children missing from a parent read whole)."""
        self.ledger.forget(keys)

    def deleted_keys(self) -> list[str]:
        """Keys read, then found gone at the source, as text (the lake's form)."""
        return self.ledger.deleted_keys()

    def find_children(
        self, ref: str, refs: list[Any], expected: int, parents: set[str | None]
    ) -> list[dict]:
        """Records no read brought whose parent was deleted before its page
        (`ChildrenByReference.find`); counted as inserted, not yet taken."""
        return self.children.find(ref, refs, expected, parents)

    def finish(self, budget: int | None = None, *, expected_new: int = 0) -> Reconciliation:
        """Probe, and chase differences through key ranges, until the total agrees or
        `budget` requests are spent (default: `default_budget` of the source's total).
        `expected_new`: records the source held before the read that no read brought (the
        caller's counts say so); the ranges are searched for them even where the total agrees."""
        enter(Phase.RECONCILE, self.entity.name)
        self.budget = budget
        stop, unconfirmed = self._rounds(expected_new)
        return self._report(stop, unconfirmed)

    def _rounds(self, expected_new: int) -> tuple[Stop, int]:
        """Rounds of a probe and a search, until one stops them: why, and how many of the
        records expected no search found."""
        fruitless = 0
        inserted_before = self.ledger.inserted  # a caller's own search (find_children) came first
        searched = False
        while True:
            self.rounds += 1
            before = self.ledger.progress()
            round_began = len(self.source.looks)
            self.total, complete = self.mark.probe()
            if self.budget is None:
                self.budget = default_budget(self.total)
            if not complete and not (self.mark.window_agrees() and self.mark.window_read):
                if self._spent():
                    return Stop.WINDOW_UNREAD, 0
                self.mark.catch_up()
                continue  # requests followed the probe: the last look is yet to come
            self.mark.move(self.mark.probed)
            self.ledger.count_shown()
            agrees = self.total == self.ledger.counted
            missing = expected_new - (self.ledger.inserted - inserted_before)
            if agrees and missing > 0 and not searched and not self._spent():
                searched = True
                if search_cost(missing, self.total) >= math.ceil(self.total / PAGE_SIZE):
                    self.ranges.read_whole(self.total)
                    expected_new = 0  # the set was read whole: nothing else is missing
                else:
                    self.ranges.search(self.total, self.budget, missing)
                continue
            if agrees:
                looks = self.source.looks[round_began:]
                self.last_look = LastLook.of(self.entity.name, looks)
                return Stop.AGREES, max(0, missing)
            if self._spent():
                return Stop.BUDGET_SPENT, 0
            self.ranges.narrow(self.total, self.budget)
            fruitless = 0 if self.ledger.progress() != before else fruitless + 1
            if fruitless >= FRUITLESS_NARROWINGS:
                return Stop.NOTHING_FOUND, 0

    def _spent(self) -> bool:
        assert self.budget is not None
        return self.source.requests >= self.budget

    def _report(self, stop: Stop, unconfirmed: int) -> Reconciliation:
        """The result, and a warning for whatever is left unreconciled."""
        assert self.total is not None
        self.ledger.count_shown()
        self.residual = abs(self.total - self.ledger.counted)
        self.unconfirmed = unconfirmed
        if stop is Stop.WINDOW_UNREAD:
            self.stale = max(1, self.mark.unverified)
        if stop is not Stop.AGREES or unconfirmed:
            figures = {
                "name": self.entity.name,
                "budget": self.budget,
                "requests": self.source.requests,
                "residual": self.residual,
                "stale": self.stale,
                "unconfirmed": unconfirmed,
            }
            log.warning(WARNINGS[stop], figures)
        return self.result


# What each stop leaves unreconciled, for an operator (`_report`'s figures by name).
WARNINGS = {
    Stop.WINDOW_UNREAD: "%(name)s: more was written since the run's mark than one request "
    "shows, and the budget (%(budget)d requests) ran out before it could be read again: at "
    "least %(stale)d records may be stale; the next run reads them",
    Stop.AGREES: "%(name)s: counts before the read promised %(unconfirmed)d records no read "
    "brought, and no key range shows them: deleted before their parent's page, or hidden in "
    "the count by as many deletes",
    Stop.BUDGET_SPENT: "%(name)s: the source changed faster than reconciliation could follow: "
    "its count still differs by %(residual)d after %(requests)d extra requests (budget "
    "%(budget)d); the next run starts from what was committed",
    Stop.NOTHING_FOUND: "%(name)s: the source's count differs by %(residual)d from the keys "
    "held, and no key range shows where (keys the service orders otherwise?)",
}


def held_from(entity: EntitySet, keys: Iterable[Any]) -> set[Any]:
    """Warehouse keys (canonical types) in the kind the API sends them (keys.to_api)."""
    found = (entity_key(entity, v) for v in keys)
    return {k for k in found if k is not None}
