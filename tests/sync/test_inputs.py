"""What a family's extraction starts from (sync/inputs.py), decided from plain values: the
run's options under a nightly budget, each set's plan, its held keys and its parents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from connectors.clinical_records.catalogue import ALL_ENTITIES, BY_NAME, DOCUMENTS, EntitySet
from sync.budget import Coverage, costs_of, reserve
from sync.inputs import budget_applies, needs_parents, set_inputs, within_budget
from sync.strategy import Mode, Options, Plan, SyncState

NOW = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
PATIENTS, APPOINTMENTS, CLAIMS = BY_NAME["Patients"], BY_NAME["Appointments"], BY_NAME["Claims"]
BRANCHES = BY_NAME["Branches"]


class Held:
    """A warehouse's committed state as plain values; counts what was read of it."""

    def __init__(self, states: dict[str, SyncState]) -> None:
        self.states = states
        self.asked: list[tuple[str, str]] = []

    def state(self, entity: EntitySet) -> SyncState:
        return self.states.get(entity.name, SyncState())

    def held_keys(self, entity: EntitySet) -> set[Any]:
        self.asked.append(("held", entity.name))
        return {1, 2}

    def parents(self, entity: EntitySet, reference: str) -> dict[Any, Any]:
        self.asked.append((reference, entity.name))
        return {1: "P1"}


def test_a_budget_weighs_only_an_exact_run_of_the_usual_kind() -> None:
    assert budget_applies(Options(), 500)
    assert not budget_applies(Options(), None)
    assert not budget_applies(Options(full=True), 500)
    assert not budget_applies(Options(exact=False), 500)
    assert not budget_applies(Options(backfill_from=NOW.date()), 500)


def test_within_budget_reads_the_stalest_whole_and_says_what_waits() -> None:
    rows = {"Patients": 2_000, "Prescriptions": 2_000, "InsuranceVerifications": 1_000}
    read = {
        "Patients": Coverage(NOW - timedelta(days=9)),
        "Prescriptions": Coverage(NOW - timedelta(days=2)),
    }
    budget = reserve(costs_of(ALL_ENTITIES, rows, read)) + 2_000 // 100 + 3
    options, told = within_budget(Options(), budget, rows, read, NOW)
    assert options.read_whole == {"Patients", "Documents"}
    assert told.startswith(f"nightly budget {budget} requests: read whole Documents, Patients;")
    assert "Prescriptions (48 h stale)" in told and "InsuranceVerifications (inf h stale)" in told


def test_a_child_with_a_set_of_its_own_has_its_parents_read_when_its_watermark_moves() -> None:
    assert needs_parents(APPOINTMENTS, Plan(APPOINTMENTS, Mode.INCREMENTAL, ""))
    assert not needs_parents(APPOINTMENTS, Plan(APPOINTMENTS, Mode.BACKFILL, ""))
    assert not needs_parents(DOCUMENTS, Plan(DOCUMENTS, Mode.SNAPSHOT, ""))  # no set of its own
    assert not needs_parents(PATIENTS, Plan(PATIENTS, Mode.SNAPSHOT, ""))  # rides with none


def test_held_keys_and_parents_are_read_only_where_the_plan_uses_them() -> None:
    committed = Held({"Claims": SyncState(watermark="2026-02-28T00:00:00Z")})
    inputs = set_inputs([PATIENTS, CLAIMS, BRANCHES], committed, Options(), NOW)
    assert inputs["Patients"].plan.mode is Mode.SNAPSHOT  # no watermark yet
    assert inputs["Claims"].plan.mode is Mode.INCREMENTAL
    assert inputs["Claims"].watermark == "2026-02-28T00:00:00Z"
    assert inputs["Claims"].held == {1, 2} and inputs["Claims"].parents == {1: "P1"}
    assert inputs["Branches"].held == set() and inputs["Branches"].parents == {}
    assert committed.asked == [("held", "Claims"), ("prescription_id", "Claims")]
