"""The change mark and the probe: writes during the read are re-read, and the run's last
look at a set comes after every other request to it. Against an in-memory source."""

from __future__ import annotations

import logging

from connectors.clinical_records.catalogue import APPOINTMENTS, BRANCHES, CLAIMS, PHYSICIANS
from connectors.clinical_records.paging import COUNT
from sync.reconcile import Reconciler
from tests.sync.memory_source import MemorySource
from tests.sync.records import appointment, instant, keys_of, numbered, read_through

ONE_BRANCH = (BRANCHES, [{"id": 1}])


def run(source: MemorySource, held=()) -> tuple[Reconciler, list[dict]]:
    """A run: the mark (request 1), the read (a request a page), then reconciliation."""
    taken: list[dict] = []
    reconciler = Reconciler(source.entity, to_batch=taken.extend, held=held, source=source)
    reconciler.begin()
    read_through(reconciler, source)
    reconciler.finish()
    return reconciler, taken


def test_an_update_of_a_record_already_read_is_re_read_by_its_cursor():
    source = MemorySource(APPOINTMENTS, [appointment(n) for n in range(250)], small=ONE_BRANCH)
    # request 1 marks, 2-4 read; before the third page, a record of the first is updated
    source.before(4, lambda: source.update("A00005", status="Cancelled", updated_at=instant(999)))
    reconciler, taken = run(source)
    result = reconciler.result
    assert result.exact and result.caught_up == 1 and result.requests == 2  # mark, probe
    assert [r["status"] for r in taken] == ["Cancelled"]


def test_inserts_before_between_and_after_the_read_keys_are_caught_up():
    source = MemorySource(APPOINTMENTS, [appointment(n) for n in range(1, 250, 2)])
    low, middle, high = (
        appointment(0, second=1000),
        appointment(100, second=1001),
        appointment(9000),
    )
    source.before(3, lambda: [source.insert(r) for r in (low, middle, high)])
    reconciler, taken = run(source)
    # the read brings the one after its keys itself; the two its pages had passed, the probe
    assert reconciler.result.exact and keys_of(taken) == {"A00000", "A00100"}
    assert {"A00000", "A00100", "A09000"} <= reconciler.held


def test_a_record_updated_before_its_page_and_after_the_read_is_taken_once_as_it_ends():
    """The first update moves its cursor before its page reads it (the version held is
    that one: not re-read); the second, after the read, is re-read."""
    source = MemorySource(APPOINTMENTS, [appointment(n) for n in range(250)])
    source.before(2, lambda: source.update("A00200", status="Arrived", updated_at=instant(998)))
    source.before(5, lambda: source.update("A00200", status="Seen", updated_at=instant(999)))
    reconciler, taken = run(source)
    assert [(r["id"], r["status"]) for r in taken] == [("A00200", "Seen")]
    assert reconciler.result.caught_up == 1 and reconciler.result.exact


def test_a_delete_during_the_read_is_found_by_counting_per_parent():
    source = MemorySource(
        APPOINTMENTS,
        [appointment(n, branch=str(1 + n % 3)) for n in range(600)],
        small=(BRANCHES, [{"id": 1}, {"id": 2}, {"id": 3}]),
    )
    source.before(3, lambda: source.delete("A00004"))  # on the first page, already read
    reconciler, _ = run(source)
    assert reconciler.deleted_keys() == ["A00004"] and reconciler.result.exact
    # mark, probe, counts per parent, then halving branch 2's 200 keys: far below re-reading
    assert reconciler.result.requests <= 8, reconciler.result


def a_day_of_claims(source_day: str = "2026-01-05") -> list[dict]:
    """150 claims written the day before and 150 on the mark's day (a date cursor)."""
    return [
        numbered(n, updated_at="2026-01-04" if n < 150 else source_day, billing_branch_id=1)
        for n in range(1, 301)
    ]


def test_a_date_cursor_reads_its_window_again_then_looks_last():
    """The probe's hundred all share the mark's day: the window (150) is read again, then
    the probe and the window's count are asked again, and they agree: the last request is
    that count, after every read."""
    source = MemorySource(CLAIMS, a_day_of_claims(), small=ONE_BRANCH)
    reconciler, taken = run(source)
    assert reconciler.result.exact and not taken
    last = source.sent[-1]
    assert last.count and last.filter is not None and last.filter.name == "updated_at"
    assert reconciler.result.rounds == 2


def test_what_a_last_look_of_two_requests_cannot_see_is_declared():
    """CI's trace (the drift-every-nine case, seed 1): as the last round's window count
    was answered, a claim numbered above every key was written today and one of today's
    claims deleted; both counts agree, neither page shows either, and the set was called
    exact with nothing declared. No order of the two requests closes it (sync/
    reconcile_mark.py says why): the run declares it (`DAY_PAIRS`), and so does one whose
    window needed no second request not."""
    source = MemorySource(CLAIMS, a_day_of_claims(), small=ONE_BRANCH)
    # 1 mark, 2-5 read, 6 probe, 7 window count, 8 read on; 9 the last probe, 10 its count
    above = numbered(301, updated_at="2026-01-05", billing_branch_id=1)
    source.before(10, lambda: (source.insert(above), source.delete(280)))
    reconciler, taken = run(source)
    assert source.sent[-1].count and source.sent[-1].filter.name == "updated_at"
    assert not taken and 301 not in reconciler.held and 280 in reconciler.held  # unseen
    assert reconciler.result.exact and "DAY_PAIRS" in reconciler.result.blind_to
    assert "more than one answer shows" in reconciler.result.blind

    source = MemorySource(CLAIMS, a_day_of_claims()[:200], small=ONE_BRANCH)  # 50 today
    reconciler, _ = run(source)
    assert reconciler.result.blind_to == {"SAME_DAY"}


def test_an_insert_while_the_window_is_read_again_is_seen_by_the_final_look():
    """A claim with the lowest key lands on the window's first page after that page was
    read: the read on misses it, the next probe (the highest keys) does not show it, but
    the window's count and lowest keys do, and the window is read again."""
    source = MemorySource(CLAIMS, a_day_of_claims(), small=ONE_BRANCH)
    # 1 mark, 2-5 read (the last page empty), 6 probe, 7 window count (its first page), 8 read on
    source.before(8, lambda: source.insert(numbered(0, updated_at="2026-01-05")))
    reconciler, taken = run(source)
    assert keys_of(taken) == {0} and 0 in reconciler.held
    assert reconciler.result.exact and reconciler.result.rounds == 3
    assert source.sent[-1].count  # still a look, after every read


def test_a_window_the_budget_leaves_unread_is_reported_stale(caplog):
    """Two requests cannot read the window again: what it holds is left unverified, and
    said (at least one record), not passed over as exact."""
    source = MemorySource(CLAIMS, a_day_of_claims(), small=ONE_BRANCH)
    reconciler = Reconciler(CLAIMS, to_batch=lambda records: None, source=source)
    reconciler.begin()
    read_through(reconciler, source)
    with caplog.at_level(logging.WARNING):
        result = reconciler.finish(budget=2)
    assert "budget (2 requests) ran out" in caplog.text and "at least 1 records" in caplog.text
    assert not result.exact and result.stale == 1 and result.requests == 3  # mark, probe, count


def test_without_a_cursor_the_probe_settles_the_highest_keys():
    """A set without a change cursor: one probe brings its highest hundred keys at one
    moment, where new records get their numbers: an insert there and a delete among them
    are settled without a key range."""
    records = [numbered(f"P{n:04d}") for n in range(300)]
    source = MemorySource(PHYSICIANS, records)
    held = {r["id"] for r in records}
    source.delete("P0250")
    source.insert(numbered("P0300"))
    reconciler = Reconciler(PHYSICIANS, to_batch=lambda records: None, held=held, source=source)
    result = reconciler.finish()
    assert reconciler.deleted_keys() == ["P0250"] and "P0300" in reconciler.held
    assert result.exact and result.requests == 1 and result.inserted == 1


def test_the_mark_counts_the_set_before_the_read():
    source = MemorySource(APPOINTMENTS, [appointment(n) for n in range(42)])
    reconciler = Reconciler(APPOINTMENTS, to_batch=lambda records: None, source=source)
    reconciler.begin()
    assert reconciler.started_total == 42 and reconciler.mark.mark[0] == instant(41)
    assert COUNT not in source.sent[0].params()  # a query, not an envelope


def a_window_of_two_pages() -> MemorySource:
    """300 claims, the 200 of the mark's day the window (a date cursor)."""
    claims = [
        numbered(n, updated_at="2026-01-04" if n <= 100 else "2026-01-05", billing_branch_id=1)
        for n in range(1, 301)
    ]
    return MemorySource(CLAIMS, claims, small=ONE_BRANCH)


def test_a_window_of_exactly_two_pages_is_read_again_in_two_requests():
    """The window's count says its second page ends it: no third, empty page. Mark, probe,
    the window's count with its first page, its second page, then the last look (a probe
    and the window's count)."""
    reconciler, taken = run(source := a_window_of_two_pages())
    assert reconciler.result.exact and not taken and source.requests == 6


def test_an_insert_past_the_window_read_to_its_count_is_caught_by_the_next_probe():
    """Written between the window's pages, past its last key: the read on stops at the
    count without it, and the next probe (the newest writes) re-reads it."""
    source = a_window_of_two_pages()
    # 1 mark, 2-5 read (the last page empty), 6 probe, 7 window count (its first page), 8 read on
    source.before(8, lambda: source.insert(numbered(1000, updated_at="2026-01-05")))
    reconciler, taken = run(source)
    assert keys_of(taken) == {1000} and 1000 in reconciler.held
    assert reconciler.result.exact and reconciler.result.caught_up == 1
