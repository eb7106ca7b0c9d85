"""The nightly budget's decisions (sync/budget.py): parsed with a clear error, the stalest
sets read whole first, key ranges of the rest, staleness in hours."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    BY_NAME,
    DOCUMENTS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PRESCRIPTIONS,
)
from connectors.clinical_records.errors import ConfigError
from sync.budget import (
    Allotment,
    Coverage,
    SetCost,
    allot,
    parse_budget,
    reserve,
    set_staleness,
    staleness_hours,
)

NOW = datetime(2026, 11, 25, 2, 0, tzinfo=UTC)


def test_budget_is_requests_or_minutes_at_the_rate():
    assert parse_budget(None, 2.0) is None and parse_budget(" ", 2.0) is None
    assert parse_budget("1500", 2.0) == 1500
    assert parse_budget("30m", 2.0) == 3600 and parse_budget("1.5 min", 4.0) == 360
    for bad in ("lots", "-5", "0", "10h"):
        with pytest.raises(ConfigError, match="CLINICAL_NIGHTLY_BUDGET"):
            parse_budget(bad, 2.0)


def costs(last: dict[str, datetime | None], rows: int = 2000) -> list[SetCost]:
    return [
        SetCost(e, rows, Coverage(last.get(e.name, NOW - timedelta(days=1)))) for e in ALL_ENTITIES
    ]


# Patients (and its documents) stalest, then InsuranceVerifications, then Prescriptions.
STALENESS_SPREAD = {
    PATIENTS.name: NOW - timedelta(days=3),
    PRESCRIPTIONS.name: NOW - timedelta(days=1),
    INSURANCE_VERIFICATIONS.name: NOW - timedelta(days=2),
    DOCUMENTS.name: NOW - timedelta(days=3),
}


def test_the_stalest_sets_are_read_whole_first_and_children_ride_free():
    everything = costs(STALENESS_SPREAD)
    one_set = reserve(everything) + 2000 // 100 + 3
    chosen = allot(everything, one_set, NOW)
    # Patients is stalest and fits; its documents ride in its pages at no cost.
    assert chosen.whole == {PATIENTS.name, DOCUMENTS.name}
    assert chosen.ranges == {}
    # With room for two: Prescriptions next (InsuranceVerifications then ride free).
    both = allot(everything, one_set + 23, NOW)
    assert both.whole == {
        PATIENTS.name,
        DOCUMENTS.name,
        PRESCRIPTIONS.name,
        INSURANCE_VERIFICATIONS.name,
    }
    assert allot(everything, 0, NOW) == Allotment()


def test_what_is_left_reads_key_ranges_of_the_stalest_sets_that_did_not_fit():
    everything = costs(STALENESS_SPREAD)
    one_set = reserve(everything) + 2000 // 100 + 3
    # Patients whole; 12 left: InsuranceVerifications (staler) gets 9 pages of a range.
    some = allot(everything, one_set + 12, NOW)
    assert some.whole == {PATIENTS.name, DOCUMENTS.name}
    assert some.ranges == {INSURANCE_VERIFICATIONS.name: 9}
    # No set fits whole: the stalest reads a range, documents never (no keys to range).
    tight = allot(everything, reserve(everything) + 10, NOW)
    assert tight == Allotment(frozenset(), {PATIENTS.name: 7})
    # A set read in part by this run keeps its place for the run's later steps.
    read = [
        replace(c, read=Coverage(c.read.covered_at, NOW)) if c.entity is PRESCRIPTIONS else c
        for c in everything
    ]
    assert allot(read, reserve(read) + 10, NOW - timedelta(minutes=5)).ranges == {
        PRESCRIPTIONS.name: 7
    }


def test_a_set_this_run_already_read_whole_keeps_its_place():
    """Steps of one run decide alone: a set that an earlier step read whole (its last read is
    after the run began) is counted first, so a later step cannot spend its share twice."""
    started = NOW - timedelta(minutes=5)
    last = {PRESCRIPTIONS.name: NOW, PATIENTS.name: NOW - timedelta(days=9)}
    everything = costs(last)
    one_set = reserve(everything) + 2000 // 100 + 3
    assert PRESCRIPTIONS.name in allot(everything, one_set, started).whole
    assert PATIENTS.name not in allot(everything, one_set, started).whole


def test_staleness_in_hours():
    assert staleness_hours(NOW - timedelta(hours=30), NOW) == 30.0
    assert staleness_hours(None, NOW) == float("inf")


def test_only_a_set_without_updated_at_is_ever_stale():
    assert set_staleness(PATIENTS, NOW - timedelta(hours=6), NOW) == 6.0
    assert set_staleness(PATIENTS, None, NOW) == float("inf")  # never read whole
    assert set_staleness(BY_NAME["Claims"], None, NOW) is None  # every run reads its updates
