"""Key ranges halved where the source's count and the keys held differ, against an
in-memory source: a set keyed by number, with no change cursor and no parent to count by
(InsuranceVerifications), so every difference is found by ranges."""

from __future__ import annotations

import logging
import math

import pytest

from connectors.clinical_records.catalogue import INSURANCE_VERIFICATIONS
from sync.reconcile import Reconciler, search_cost
from tests.sync.memory_source import MemorySource
from tests.sync.records import keys_of, numbered

ENTITY = INSURANCE_VERIFICATIONS


def a_set(keys, **fields) -> MemorySource:
    return MemorySource(ENTITY, [numbered(k, prescription_id=k // 3, **fields) for k in keys])


def reconcile(source: MemorySource, held, **finish) -> tuple[Reconciler, list[dict]]:
    taken: list[dict] = []
    reconciler = Reconciler(ENTITY, to_batch=taken.extend, held=held, source=source)
    reconciler.finish(**finish)
    return reconciler, taken


@pytest.mark.parametrize("deleted", [1, 517, 996])  # before, between, among the read keys' last
def test_a_delete_is_found_by_halving_at_the_cost_of_a_few_requests(deleted):
    held = set(range(1, 2001))
    source = a_set(held - {deleted})
    reconciler, _ = reconcile(source, held)
    result = reconciler.result
    assert reconciler.deleted_keys() == [str(deleted)] and result.exact
    assert result.requests <= 2 + 2 * math.ceil(math.log2(20)), result  # 20 pages to read


@pytest.mark.parametrize("inserted", [0, 1002, 5000])  # before, between, after the read keys
def test_an_insert_the_read_passed_is_found_and_taken(inserted):
    held = set(range(1, 2001, 2)) | {4000}
    source = a_set(held | {inserted})
    reconciler, taken = reconcile(source, held)
    assert keys_of(taken) >= {inserted} and inserted in reconciler.held
    assert reconciler.result.inserted == 1 and reconciler.result.exact


def test_an_insert_and_a_delete_cancel_in_the_count_and_are_found_only_when_expected():
    held = set(range(1, 2001)) - {700}
    source = a_set((held | {700}) - {1500})
    reconciler, _ = reconcile(source, held)
    assert reconciler.result.exact and reconciler.result.requests == 1  # the count agrees
    assert 700 not in reconciler.held and 1500 in reconciler.held

    source = a_set((held | {700}) - {1500})
    reconciler, taken = reconcile(source, held, expected_new=1)
    result = reconciler.result
    assert keys_of(taken) >= {700} and reconciler.deleted_keys() == ["1500"]
    assert (result.inserted, result.deleted, result.unconfirmed) == (1, 1, 0)
    assert result.requests < 20, result  # below reading the set again (20 pages)


def test_records_expected_that_no_range_shows_are_reported_unconfirmed(caplog):
    held = set(range(1, 5001))
    with caplog.at_level(logging.WARNING):
        reconciler, _ = reconcile(a_set(held), held, expected_new=2)
    result = reconciler.result
    assert "promised 2 records no read brought" in caplog.text
    assert result.unconfirmed == result.unreconciled == 2 and not result.exact
    assert result.requests <= 2 + search_cost(2, 5000) < 50, result  # not a read of 50 pages


def test_a_set_no_dearer_to_read_than_to_search_is_read_whole():
    held = set(range(1, 151))
    reconciler, _ = reconcile(a_set(held), held, expected_new=2)
    result = reconciler.result
    assert result.exact and result.requests == 2 + 2, result  # 2 probes, 2 pages read


def test_a_range_of_two_pages_costs_one_request_when_its_first_page_holds_the_difference():
    held = set(range(1, 181))
    source = a_set(held - {40})
    reconciler, _ = reconcile(source, held)
    assert reconciler.deleted_keys() == ["40"]
    assert reconciler.result.requests == 2 + 1  # 2 probes, its first page with its count


def test_a_source_emptied_is_read_and_every_key_is_gone():
    held = set(range(1, 301))
    reconciler, _ = reconcile(a_set(()), held)
    assert len(reconciler.deleted_keys()) == 300 and reconciler.result.exact


def test_a_budget_spent_leaves_the_difference_reported():
    held = set(range(1, 3001))
    source = a_set(held - {5, 1700, 2900})
    reconciler, _ = reconcile(source, held, budget=3)
    result = reconciler.result
    assert not result.exact and 0 < result.residual <= 3 and result.requests >= 3


def test_a_difference_no_range_shows_is_reported_after_fruitless_rounds(caplog):
    """A record without a usable key counts at the source but in no key range: deleted,
    the count differs by one that no range can show; after three rounds that find nothing
    it is reported, not searched for until the budget runs out."""
    records = [numbered(k) for k in range(1, 501)] + [{"id": None}]
    source = MemorySource(ENTITY, records)
    reconciler = Reconciler(ENTITY, to_batch=lambda records: None, source=source)
    reconciler.read(records)
    source.tables[ENTITY.name].pop()
    with caplog.at_level(logging.WARNING):
        result = reconciler.finish()
    assert result.residual == 1 and result.rounds == 3 and result.requests == 3
    assert "count differs by 1 from the keys held, and no key range" in caplog.text


def read_whole(source: MemorySource, held) -> tuple[Reconciler, list[dict]]:
    """A set no dearer to read than to search for two records: probe (request 1), the
    read's first page with its count (2), its second (3), and so on, then the last probe."""
    return reconcile(source, held, expected_new=2)


def test_a_range_of_exactly_two_pages_is_read_in_two_requests():
    """The first page's count says the second page ends the range: no third, empty page."""
    held = set(range(2, 402, 2))  # 200 keys
    reconciler, _ = read_whole(a_set(held), held)
    assert reconciler.result.exact and reconciler.result.requests == 2 + 2  # probes, pages


@pytest.mark.parametrize("inserted", [251, 1001])  # within the second page, past every key
def test_an_insert_between_the_pages_of_a_range_read_to_its_count_is_found(inserted):
    """251 pushes the range's highest held key off the second page: read on to settle it
    (not taken as deleted). 1001 lies past every held key: the read stops at its count, and
    the last probe (the highest keys) shows it."""
    held = set(range(2, 402, 2))
    source = a_set(held)
    source.before(3, lambda: source.insert(numbered(inserted, prescription_id=1)))
    reconciler, taken = read_whole(source, held)
    result = reconciler.result
    assert reconciler.held == held | {inserted} and inserted in keys_of(taken)
    assert (result.inserted, result.deleted) == (1, 0) and result.exact, result


def test_a_delete_between_the_pages_of_a_range_read_to_its_count_is_found():
    held = set(range(2, 402, 2))
    source = a_set(held)
    source.before(3, lambda: source.delete(300))
    reconciler, _ = read_whole(source, held)
    assert reconciler.deleted_keys() == ["300"] and reconciler.held == held - {300}
    assert reconciler.result.exact and reconciler.result.requests == 2 + 2
