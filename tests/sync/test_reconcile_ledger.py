"""The ledger alone owns the keys held and gone, and counts what changed as it happens."""

from __future__ import annotations

from connectors.clinical_records.catalogue import PRESCRIPTIONS
from sync.reconcile_ledger import Ledger, fingerprint
from tests.sync.memory_source import MemorySource
from tests.sync.records import keys_of, numbered


def ledger_of(held: set[int]) -> tuple[Ledger, list[dict]]:
    taken: list[dict] = []
    return Ledger(PRESCRIPTIONS, taken.extend, held), taken


def test_a_range_as_it_stands_settles_its_held_keys():
    ledger, taken = ledger_of({1, 2, 3, 4})
    ledger.settle_range([2, 3, 4], [numbered(2), numbered(4), numbered(5)])
    assert ledger.held == {1, 2, 4, 5}
    assert ledger.deleted_keys() == ["3"] and ledger.deleted == 1
    assert ledger.inserted == 1  # 5: there, not held
    assert keys_of(taken) == {2, 4, 5}  # what the range brought goes into the batch


def test_a_key_found_again_is_no_longer_deleted():
    """A key forgotten (its parent read whole without it) then found by a range: the
    deleted count follows the keys gone, with nothing copied back by hand."""
    ledger, _ = ledger_of({1, 2})
    ledger.forget([2])
    assert ledger.deleted == 1 and 2 not in ledger.held
    ledger.settle_range([1], [numbered(1), numbered(2)])
    assert ledger.deleted == 0 and ledger.held == {1, 2}


def test_keys_missing_from_a_cell_are_suspects_until_asked_by_key():
    """A cell is one parent's records: a key missing from it may have moved to another
    parent. Asked by key: one gone (404) is deleted, one that moved is taken as it is now."""
    ledger, taken = ledger_of({1, 2, 3})
    ledger.settle_range([1, 2, 3], [numbered(1, branch_id=7)], cell=True)
    assert ledger.held == {1, 2, 3} and ledger.deleted == 0  # not yet: only suspected
    source = MemorySource(PRESCRIPTIONS, [numbered(1), numbered(3, branch_id=8)])
    ledger.confirm(source)
    assert ledger.deleted_keys() == ["2"] and ledger.held == {1, 3}
    assert {r["id"]: r.get("branch_id") for r in taken}[3] == 8
    assert source.requests == 2  # one per suspect
    ledger.confirm(source)
    assert source.requests == 2  # no suspects left: nothing asked


def test_records_without_a_key_count_but_cannot_be_ranged():
    ledger, _ = ledger_of(set())
    ledger.read([numbered(1), {"id": None}, {"id": 2.5}])
    assert ledger.held == {1} and ledger.counted == 3


def test_a_record_caught_up_is_held_again_and_counted():
    ledger, taken = ledger_of({1})
    ledger.forget([1])
    ledger.rewritten([numbered(1), numbered(9)])
    assert ledger.held == {1, 9} and ledger.deleted == 0 and ledger.caught_up == 2
    assert keys_of(taken) == {1, 9}


def test_watchers_see_every_record_read_or_re_read():
    ledger, _ = ledger_of(set())
    seen: list[int] = []
    ledger.watchers.append(lambda records: seen.extend(r["id"] for r in records))
    ledger.read([numbered(1)])
    ledger.settle_range([], [numbered(2)])
    ledger.add_to_batch([])
    assert seen == [1, 2]


def test_a_version_is_handed_to_the_batch_once():
    """A record asked for by key after it moved parent comes again with its new parent's
    records: the same version is not handed twice; a newer one is."""
    ledger, taken = ledger_of({1, 2})
    ledger.settle_range([1, 2], [numbered(1, branch_id=7)], cell=True)
    ledger.confirm(
        MemorySource(PRESCRIPTIONS, [numbered(1, branch_id=7), numbered(2, branch_id=8)])
    )
    ledger.settle_range([], [numbered(2, branch_id=8), numbered(3, branch_id=8)], cell=True)
    assert [r["id"] for r in taken] == [1, 2, 3]
    ledger.rewritten([numbered(2, branch_id=9)])
    assert [(r["id"], r["branch_id"]) for r in taken[3:]] == [(2, 9)]


def test_a_version_is_its_fields_whatever_their_order_or_annotations():
    same = {"id": "007", "amount": 12.5, "nested": {"b": 1, "a": [1, None]}}
    reordered = {"nested": {"a": [1, None], "b": 1}, "amount": 12.5, "id": "007"}
    annotated = {"@odata.etag": 'W/"3"', **same}
    assert fingerprint(same) == fingerprint(reordered) == fingerprint(annotated)
    for changed in ({**same, "amount": 12.51}, {**same, "id": "7"}, {**same, "extra": None}):
        assert fingerprint(changed) != fingerprint(same)
    wide = {"id": 10**30, "when": "2026-11-26T07:00:00+05:30"}  # wider than 64 bits
    assert fingerprint(wide) != fingerprint({**wide, "id": 10**30 + 1})
