"""Children by reference: the children of a parent deleted before its page came with no
page, and lie together in ranges of their reference (InsuranceVerifications by
prescription), where one search finds them all."""

from __future__ import annotations

import math

from connectors.clinical_records.catalogue import INSURANCE_VERIFICATIONS
from connectors.clinical_records.keys import key_text
from sync.reconcile import Reconciler, search_cost
from tests.sync.memory_source import MemorySource
from tests.sync.records import keys_of, numbered

ENTITY = INSURANCE_VERIFICATIONS
REF = "prescription_id"


def verifications(lost_parent: int | None) -> tuple[MemorySource, Reconciler, set[str | None]]:
    """3000 verifications, three a prescription; those of `lost_parent` (deleted before
    its page) never read. Returns the source, a reconciler holding what was read, and the
    parents read."""
    records = [numbered(k, prescription_id=k // 3) for k in range(3000)]
    source = MemorySource(ENTITY, records)
    read = [r for r in records if r[REF] != lost_parent]
    reconciler = Reconciler(ENTITY, to_batch=lambda records: None, source=source)
    reconciler.read(read)
    parents = {key_text(p) for p in range(1000) if p != lost_parent}
    return source, reconciler, parents


def refs_held(reconciler: Reconciler, source: MemorySource) -> list[int]:
    table = source.tables[ENTITY.name]
    return sorted(r[REF] for r in table if r["id"] in reconciler.held)


def test_the_children_of_a_parent_deleted_before_its_page_are_found_together():
    source, reconciler, parents = verifications(lost_parent=617)
    found = reconciler.find_children(REF, refs_held(reconciler, source), 3, parents)
    assert keys_of(found) == {1851, 1852, 1853}
    result = reconciler.result
    # both halves, then a count a level (5 levels of halving to a page of 3000) and a read:
    # a third of reading the set's 30 pages
    assert result.inserted == 3 and source.requests <= 2 * math.ceil(math.log2(30)), result
    assert reconciler.finish(expected_new=0).exact  # the caller takes them: then it agrees


def test_a_child_written_under_a_parent_read_is_returned_but_not_counted_as_expected():
    """A verification inserted during the run under a prescription that was read is new,
    not one of the children expected: the search goes on until those are found."""
    source, reconciler, parents = verifications(lost_parent=100)
    source.insert(numbered(9000, prescription_id=5))
    found = reconciler.find_children(REF, refs_held(reconciler, source), 3, parents)
    assert keys_of(found) >= {300, 301, 302}
    assert sum(key_text(r[REF]) not in parents for r in found) == 3


def test_a_search_for_children_not_there_is_bounded():
    source, reconciler, parents = verifications(lost_parent=None)
    found = reconciler.find_children(REF, refs_held(reconciler, source), 2, parents)
    assert found == [] and source.requests <= search_cost(2, 3002)


def test_nothing_expected_asks_nothing():
    source, reconciler, parents = verifications(lost_parent=3)
    assert reconciler.find_children(REF, refs_held(reconciler, source), 0, parents) == []
    assert source.requests == 0


def test_children_read_under_one_reference_are_read_to_the_count_of_their_first_page():
    """Prescription 500 holds 197 verifications, and the 3 of 501 (deleted before its page)
    share its range of references: that range's 200 records are read in two pages (the
    first with their count), not a third, empty one."""
    records = [numbered(k, prescription_id=k // 3) for k in range(1500)]
    records += [numbered(k, prescription_id=500) for k in range(5000, 5197)]
    records += [numbered(k, prescription_id=501) for k in range(6000, 6003)]
    source = MemorySource(ENTITY, records)
    reconciler = Reconciler(ENTITY, to_batch=lambda records: None, source=source)
    reconciler.read([r for r in records if r[REF] != 501])
    parents = {key_text(p) for p in range(501)}
    found = reconciler.find_children(REF, refs_held(reconciler, source), 3, parents)
    assert keys_of(found) == {6000, 6001, 6002}
    read_on = [q for q in source.sent if q.filter is not None and "id gt" in str(q.params())]
    assert len(read_on) == 1, source.sent[-3:]
