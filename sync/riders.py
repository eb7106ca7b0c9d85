"""A child set riding in its parent's pages, and what completes it once the parents are read:
parents whose children did not all come, children no parent reaches, children gone with
their parent (the rules: sync/packed.py). Logs carry counts only, never an id (PHI).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    PAGE_SIZE,
    Edm,
    EntitySet,
    Navigation,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from connectors.clinical_records.keys import entity_key, key_text, to_api
from connectors.clinical_records.query import F, Query
from sync import orphans
from sync.extract import BatchWriter, Extraction, cursor_filter, record_writer
from sync.phase import Phase, enter
from sync.reconcile import Reconciler, Reconciliation
from sync.rider_plan import Completion, held_children
from sync.service_memory import ServiceMemory
from sync.strategy import Mode, Plan

DOCUMENTS_BLIND = (
    "a document uploaded or deleted during the run under a patient already read is seen by "
    "the next run (documents have no set to count)"
)


@dataclass
class SetInput:
    """What one selected set of the family starts from."""

    plan: Plan
    watermark: str | None = None
    held: set[Any] = field(default_factory=set)  # live keys (an increment reconciles them)
    parents: dict[Any, Any] = field(default_factory=dict)  # live key -> its parent's key


@dataclass
class Rider:
    """A child set riding in its parent's pages during one run. Its children go to the batch
    and the reconciler page by page, as they come (a family of millions of children is never
    held in memory); documents, which have no reconciliation, are held per patient until
    their completion (a patient listed alone has the listing's)."""

    entity: EntitySet
    nav: Navigation
    input: SetInput
    writer: BatchWriter
    reconciler: Reconciler | None
    # parent -> when its latest answer was read, and the nested count that answer gave
    counted: dict[Any, tuple[float, int]] = field(default_factory=dict)
    documents: dict[Any, list[dict]] = field(default_factory=dict)  # patient -> its latest answer's
    parents_cut_short: list[Any] = field(default_factory=list)  # their children did not all come
    fetched: int = 0
    taken: dict[Any, float] = field(default_factory=dict)  # key -> when its version was answered
    no_parent: set[Any] = field(default_factory=set)  # held or taken with a null reference
    refs: dict[Any, Any] = field(default_factory=dict)  # key -> its parent reference, as sent
    choice: str = ""
    page: list[dict] = field(default_factory=list)  # children of the page being unpacked

    @property
    def reached(self) -> int:
        """The nested counts of the parents read, each parent once (a page's overlap, or a
        parent shown again in another version, brings its count again: the latest stands)."""
        return sum(count for _, count in self.counted.values())

    def take(self, parent: Any, children: list[dict], count: int, answered: float) -> None:
        """A parent's expanded children, as an answer read at `answered` showed them. Pages
        in flight are answered in any order: of a parent shown twice, the later answer's
        count stands (and its documents), and of a record shown twice, the later answer's
        version; an older one of a record already taken newer is not taken again. Taken at
        the page's end (`end_page`)."""
        before = self.counted.get(parent)
        latest = before is None or before[0] <= answered
        if latest:
            self.counted[parent] = (answered, count)
        if self.reconciler is None:
            if latest:
                self.documents[parent] = children
            return
        self.page.extend(c for c in children if self.taken.get(self.key(c), answered) <= answered)

    def end_page(self, answered: float) -> None:
        """The children a page (answered at `answered`) brought, to the batch and the
        reconciler."""
        if self.page:
            self.add(self.page, answered=answered)
            self.page = []

    def arrived_documents(self, listed: Iterable[Any] = ()) -> list[dict]:
        """Each patient's documents as the latest answer showing the patient had them (one
        an older answer showed under a patient shown again without it was deleted in
        between), but those of a patient `listed` alone: the listing's stand."""
        skip = set(listed)
        return [d for p, docs in self.documents.items() if p not in skip for d in docs]

    def add(self, records: list[dict], *, answered: float = math.inf) -> None:
        """Records of this set, however they came: to the batch, the reconciler, and the
        keys, references and null references the completion weighs; `answered`: when the
        answer that brought them was read (records read after the pages: later than any)."""
        for start in range(0, len(records), PAGE_SIZE):  # as pages come: the writer's rhythm
            self.writer.add(records[start : start + PAGE_SIZE])
        if self.reconciler:
            self.reconciler.read(records)
        self.fetched += len(records)
        kind = str if self.entity.field(self.nav.remote).type is Edm.STRING else int
        for record in records:
            key = self.key(record)
            self.taken[key] = answered
            ref = record.get(self.nav.remote)
            if ref is None:
                self.no_parent.add(key)
            else:
                self.no_parent.discard(key)
            if isinstance(ref, kind) and not isinstance(ref, bool):  # orderable as the API
                self.refs[key] = ref

    def key(self, record: dict) -> Any:
        """A record's key in the API's kind (as the pager and the reconciler compare it)."""
        return entity_key(self.entity, record.get(self.entity.key))


def complete(
    rider: Rider, parents: list[Any], client: ClinicalClient, memory: ServiceMemory, say: Any
) -> Extraction:
    """Everything the parents' pages did not bring, then the rider's batch; `memory`: what
    the service refused before (known orphans come in batches where `or` is accepted)."""
    plan = rider.input.plan
    entity = rider.entity
    enter(Phase.EXTRACT, entity.name)
    result = Extraction(entity.name, plan.mode, plan.reason, rider.writer.run_id)
    if entity is DOCUMENTS:
        return _complete_documents(rider, client, result, say)
    reconciler = rider.reconciler
    assert reconciler is not None and reconciler.started_total is not None
    remote = rider.nav.remote
    parents_read = {key_text(p) for p in parents}
    read_whole = parents_read - {key_text(p) for p in rider.parents_cut_short}
    held = held_children(entity, rider.input.parents, read_whole)
    rider.no_parent.update(held.without_parent)
    known, gone = list(held.under_parent_not_read), held.under_parent_read
    refs = _vanished(rider, held.parents_not_read, parents_read)
    new = 0  # records there before the read that no parent brought, nor a null reference
    if plan.mode is Mode.SNAPSHOT:
        some_not_reached = reconciler.started_total > rider.reached
        nulls = client.count(entity, F(remote) == None) if some_not_reached else 0  # noqa: E711
        completion = Completion(
            reconciler.started_total,
            rider.reached,
            nulls,
            len(known),
            orphans.requests(entity, known, memory, refs),
            len(rider.parents_cut_short),
        )
        rider.choice = completion.reason()
        if completion.read_alone:
            brought = set(rider.taken)  # by the parents' pages, already in the batch
            whole = _all(client, entity, None)
            rider.add(whole)
            reconciler.forget(brought - {rider.key(r) for r in whole})  # gone since their page
            known, refs, rider.parents_cut_short = [], [], []
        else:
            if nulls:
                rider.add(_all(client, entity, F(remote) == None))  # noqa: E711
            new = completion.new
    else:
        rider.add(_all(client, entity, cursor_filter(plan)))
        rider.choice = f"{plan.reason}, and with its parents; {len(rider.parents_cut_short)} parents read alone"
        known, refs = [], []  # their writes come by cursor; a delete among them shows in the count
        _settle_no_parent(rider, client, reconciler)
    for parent in rider.parents_cut_short:
        children = _all(client, entity, F(remote) == parent)
        rider.add(children)
        new = max(0, new - len(children))  # not reached, but no orphans
    known = [k for k in known if k not in rider.taken]
    found = orphans.read_known(client, entity, known, memory, say, refs)
    rider.add(found)
    reconciler.forget(k for k in gone if k not in rider.taken)
    there = {rider.key(r) for r in found}
    reconciler.forget(k for k in known if k not in there)
    new = max(0, new - len(there - set(held.under_parent_not_read)))  # found by reference
    if new:  # children of parents deleted before their page: searched by their reference
        found = reconciler.find_children(remote, sorted(rider.refs.values()), new, parents_read)
        rider.add(found)
        new = max(0, new - sum(key_text(r.get(remote)) not in parents_read for r in found))
    say.info(f"{entity.name}: {rider.choice}")
    result.reconciled(reconciler, reconciler.finish(expected_new=new))
    rider.writer.finish(reconciler.deleted_keys())
    record_writer(result, rider.writer, rider.fetched)
    return result


def _complete_documents(
    rider: Rider, client: ClinicalClient, result: Extraction, say: Any
) -> Extraction:
    """The documents that came with their patients, and those of each patient whose
    documents did not all come (or were not expanded), listed one patient at a time."""
    rider.add(rider.arrived_documents(listed=rider.parents_cut_short))
    rider.add(list(_list_documents(client, rider.parents_cut_short)))
    rider.choice = (
        f"with their patients; {len(rider.parents_cut_short)} patients listed alone"
        if rider.parents_cut_short
        else "with their patients"
    )
    rider.writer.finish()
    result.reconciliation = Reconciliation(blind=DOCUMENTS_BLIND)
    result.source_total = rider.fetched
    record_writer(result, rider.writer, rider.fetched)
    say.info(f"{rider.entity.name}: {rider.fetched} read, {rider.choice}")
    return result


def _vanished(rider: Rider, held_parents: tuple[Any, ...], read: set[str | None]) -> list[Any]:
    """The parents of held children that no page brought now (deleted since, or dangling),
    as `(reference, parent)` terms: every child of theirs is asked for, not only the held
    ones, so that a child the day added under a parent the run then deleted is found."""
    remote, field = rider.nav.remote, rider.entity.field(rider.nav.remote)
    refs = (to_api(field, p) for p in held_parents if key_text(p) not in read)
    return [(remote, ref) for ref in refs if ref is not None]


def _settle_no_parent(rider: Rider, client: ClinicalClient, reconciler: Reconciler) -> None:
    """An increment's children with a null reference, held or just read: one count tells
    whether any was deleted; only then are they read again (by filter) to find which."""
    entity, remote = rider.entity, rider.nav.remote
    expected = set(rider.no_parent)
    if client.count(entity, F(remote) == None) == len(expected):  # noqa: E711
        return
    records = _all(client, entity, F(remote) == None)  # noqa: E711
    there = {rider.key(r) for r in records}
    rider.add(records)
    reconciler.forget(expected - there)


def _all(client: ClinicalClient, entity: EntitySet, condition: Any) -> list[dict]:
    return [
        r
        for page in client.iter_pages(entity, Query(entity, filter=condition))
        for r in page.records
    ]


def _list_documents(client: ClinicalClient, patients: list[Any]) -> Iterator[dict]:
    """Each patient's documents; a patient deleted meanwhile (404) has none."""
    docs = DocumentsClient(client)
    for records in client.each(lambda patient: docs.list(str(patient)), patients):
        yield from records or []
