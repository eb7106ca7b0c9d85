"""Counts per parent: a set a small set navigates to (Prescriptions, by Branches) is
counted per branch in one request, and only the branches that differ are searched."""

from __future__ import annotations

import logging

from connectors.clinical_records.catalogue import BRANCHES, PRESCRIPTIONS
from sync.reconcile import Reconciler
from tests.sync.memory_source import MemorySource
from tests.sync.records import keys_of, numbered

BRANCH_IDS = (1, 2, 3)


def prescriptions(**source: bool) -> tuple[MemorySource, list[dict]]:
    """600 prescriptions, 200 a branch, and a source that holds them."""
    records = [numbered(k, branch_id=BRANCH_IDS[k % 3]) for k in range(1, 601)]
    small = (BRANCHES, [{"id": b} for b in BRANCH_IDS])
    return MemorySource(PRESCRIPTIONS, records, small=small, **source), records


def read(source: MemorySource, records: list[dict]) -> tuple[Reconciler, list[dict]]:
    taken: list[dict] = []
    reconciler = Reconciler(PRESCRIPTIONS, to_batch=taken.extend, source=source)
    reconciler.read(records)
    return reconciler, taken


def branches_searched(source: MemorySource) -> set[int]:
    """The branches whose cell a request was limited to."""
    found = set()
    for query in source.sent:
        if isinstance(query, str) or query.filter is None:
            continue
        parts = getattr(query.filter, "parts", (query.filter,))
        found |= {p.value for p in parts if getattr(p, "name", None) == "branch_id"}
    return found


def test_only_the_branch_whose_count_differs_is_searched():
    source, records = prescriptions()
    reconciler, _ = read(source, records)
    source.delete(302)  # branch 3
    result = reconciler.finish()
    assert reconciler.deleted_keys() == ["302"] and result.exact
    assert branches_searched(source) == {3}
    # probe, counts per branch, the cell's first page and its rest, the suspect by key (404)
    assert result.requests == 5 + 1, result


def test_a_record_that_moved_to_another_parent_unseen_is_taken_not_deleted():
    """Moved from branch 1 to 2 while a record of branch 2 was deleted: branch 1 misses it
    (a suspect, asked by key: there, now under branch 2), then branch 2 shows the delete."""
    source, records = prescriptions()
    reconciler, taken = read(source, records)
    source.update(3, branch_id=2)  # was branch 1 (3 % 3 == 0 -> BRANCH_IDS[0])
    source.delete(301)  # branch 2
    result = reconciler.finish()
    assert reconciler.deleted_keys() == ["301"] and 3 in reconciler.held
    assert [r["branch_id"] for r in taken if r["id"] == 3] == [2]  # as it is now, once
    assert result.exact and result.deleted == 1


def test_a_refusal_of_counts_per_parent_is_said_and_key_ranges_search_alone(caplog):
    source, records = prescriptions(refuse_parent_counts=True)
    reconciler, _ = read(source, records)
    source.delete(302)
    with caplog.at_level(logging.WARNING, logger="sync.reconcile_cells"):
        result = reconciler.finish()
    assert result.parent_counts_refused and "refused counts per Branches" in caplog.text
    assert reconciler.deleted_keys() == ["302"] and result.exact
    assert "reconcile_parent_counts_refused" not in result.metadata()  # no new figure
    assert branches_searched(source) == set()


def test_keys_held_without_their_parent_are_searched_by_key_ranges():
    """An increment holds keys from the warehouse, not read now: their parents are not
    known, so no branch is counted (no request to Branches)."""
    source, records = prescriptions()
    reconciler = Reconciler(
        PRESCRIPTIONS, to_batch=lambda r: None, held=keys_of(records), source=source
    )
    source.delete(302)
    result = reconciler.finish()
    assert reconciler.deleted_keys() == ["302"] and result.exact
    assert all(isinstance(q, str) or q.entity is PRESCRIPTIONS for q in source.sent)


def test_records_with_no_parent_are_a_cell_of_their_own():
    source, records = prescriptions()
    orphan = numbered(0, branch_id=None)  # the lowest key: no probe of the highest shows it
    source.insert(orphan)
    reconciler, _ = read(source, [*records, orphan])
    source.delete(0)
    result = reconciler.finish()
    assert reconciler.deleted_keys() == ["0"] and result.exact
    assert branches_searched(source) == {None}
