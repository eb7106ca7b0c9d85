"""The façade: rounds end for one of four reasons, each reported once; the figures keep
their names; the in-memory source answers as the spec says for the shapes it is asked."""

from __future__ import annotations

import logging

from connectors.clinical_records.catalogue import APPOINTMENTS, INSURANCE_VERIFICATIONS
from connectors.clinical_records.query import Comparison, Query
from sync.reconcile import Reconciler, Reconciliation
from tests.sync.memory_source import MemorySource
from tests.sync.records import appointment, numbered

FIGURES = [
    "reconcile_caught_up",
    "reconcile_inserted",
    "reconcile_deleted",
    "reconcile_ranges",
    "reconcile_rounds",
    "reconcile_requests",
    "reconcile_residual",
    "reconcile_stale",
    "reconcile_unconfirmed",
    "reconciled",
]


def test_the_figures_keep_their_names():
    assert list(Reconciliation().figures()) == FIGURES
    assert list(Reconciliation().metadata()) == [*FIGURES, "reconcile_blind"]


def test_a_count_that_agrees_ends_in_one_request_and_says_nothing(caplog):
    held = set(range(1, 401))
    source = MemorySource(INSURANCE_VERIFICATIONS, [numbered(k) for k in held])
    reconciler = Reconciler(
        INSURANCE_VERIFICATIONS, to_batch=lambda r: None, held=held, source=source
    )
    with caplog.at_level(logging.WARNING):
        result = reconciler.finish()
    assert result.exact and result.requests == result.rounds == 1 and not caplog.text
    assert reconciler.total == 400


def test_a_budget_spent_is_said_once_with_the_difference(caplog):
    held = set(range(1, 3001))
    source = MemorySource(INSURANCE_VERIFICATIONS, [numbered(k) for k in held - {9, 1999}])
    reconciler = Reconciler(
        INSURANCE_VERIFICATIONS, to_batch=lambda r: None, held=held, source=source
    )
    with caplog.at_level(logging.WARNING):
        result = reconciler.finish(budget=2)
    assert [r.getMessage() for r in caplog.records] == [
        f"InsuranceVerifications: the source changed faster than reconciliation could "
        f"follow: its count still differs by {result.residual} after {result.requests} extra "
        f"requests (budget 2); the next run starts from what was committed"
    ]
    assert result.residual in (1, 2) and not result.exact


def test_the_memory_source_orders_and_filters_as_the_service_does():
    """Nulls match only `eq null` and sort first ascending; date-times order in time
    whatever their offset; the count is taken before `$top`."""
    records = [
        appointment(1, second=50),
        {**appointment(2), "updated_at": "2026-01-05T01:00:00+02:00"},  # 23:00 the day before
        appointment(3, branch=None),
    ]
    source = MemorySource(APPOINTMENTS, records)
    newest = source.page(Query(APPOINTMENTS, orderby=[("updated_at", True)], top=2, count=True))
    assert [r["id"] for r in newest["value"]] == ["A00001", "A00003"]
    assert newest["@odata.count"] == 3
    no_branch = Query(APPOINTMENTS, filter=Comparison("branch_id", "eq", None))
    assert [r["id"] for r in source.page(no_branch)["value"]] == ["A00003"]
    after = Query(APPOINTMENTS, filter=Comparison("branch_id", "ge", "0"))
    assert [r["id"] for r in source.page(after)["value"]] == ["A00001", "A00002"]
    by_branch = source.page(Query(APPOINTMENTS, orderby=[("branch_id", False)]))
    assert by_branch["value"][0]["id"] == "A00003"
