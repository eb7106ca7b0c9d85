"""Counts per parent: a set a small set navigates to, split into its parents' cells.

Branches -> Patients, Prescriptions, Claims, Appointments (`partition_of`): one request,
`Branches?$expand=Patients($count=true;$top=0)`, counts the set per parent, and only the
cells whose count differs from the keys held under that parent are halved, so a delete is
searched for among a few hundred records, not the whole set. A key missing from its cell is
a suspect, asked for by key before it counts as deleted (`Ledger.confirm`): it may have
moved to another parent unseen (a set without `updated_at`), and is then taken as it is now.
"""

from __future__ import annotations

import logging
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, EntitySet, partition_of
from connectors.clinical_records.errors import ApiError
from connectors.clinical_records.keys import to_api
from connectors.clinical_records.paging import COUNT
from connectors.clinical_records.query import Comparison, Expand, Query
from sync.reconcile_ledger import Ledger
from sync.reconcile_ranges import Span
from sync.reconcile_source import Source

log = logging.getLogger(__name__)


class ParentCells:
    """Splits a set's whole span into the cells of its parents that differ. Watches the
    ledger for each key's parent. `refused`: the service answered the counts per parent
    with a 400, so key ranges are searched alone (said in the log and the result)."""

    def __init__(self, source: Source, ledger: Ledger) -> None:
        self.source, self.ledger = source, ledger
        self.partition = partition_of(source.entity)
        self.parents: dict[Any, Any] = {}  # key -> its reference into the partition, as sent
        self.refused = False
        ledger.watchers.append(self._note_parents)

    def split(self, whole: Span) -> list[Span] | None:
        """A span per cell whose count differs from its held keys, the records with no
        parent one cell of their own. None where counts per parent cannot help: no small
        set, parents past one page, keys held without their parent (an increment's), or
        the service refused."""
        if self.partition is None or not self.ledger.held <= self.parents.keys():
            return None
        small, navigation = self.partition
        envelope = self._counts(small, navigation.name)
        if envelope is None:
            return None
        parents = envelope["value"]
        if int(envelope[COUNT]) > len(parents):
            return None
        remote = navigation.remote
        reference = self.source.entity.field(remote)
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
                cells.append(Span(None, None, keys, count, where=Comparison(remote, "eq", parent)))
        orphaned = by_parent.pop(None, [])
        if by_parent:  # held under a parent the small set does not have
            return None
        if whole.count - counted != len(orphaned):
            where = Comparison(remote, "eq", None)
            cells.append(Span(None, None, orphaned, whole.count - counted, where=where))
        return cells

    def _counts(self, small: EntitySet, navigation: str) -> dict[str, Any] | None:
        """One request: the small set's parents, each with its count of the set's records;
        None where the service refuses it (remembered for this reconciliation)."""
        query = Query(
            small,
            select=[small.key],
            orderby=[(small.key, False)],
            top=PAGE_SIZE,
            count=True,
            expand=[Expand(navigation, top=0, count=True)],
        )
        try:
            return self.source.page(query)
        except ApiError as refused:
            if refused.status != 400:
                raise
            log.warning(
                "%s: the service refused counts per %s (400); searching key ranges alone",
                self.source.entity.name,
                small.name,
            )
            self.partition, self.refused = None, True
            return None

    def _note_parents(self, records: list[dict]) -> None:
        if self.partition is None:
            return
        remote = self.partition[1].remote
        for record in records:
            if (key := self.ledger.key(record)) is not None:
                self.parents[key] = record.get(remote)
