"""How a run ended, read from its Dagster events: exact, not exact, or failed.

One rule for the CLI's exit status, the alert and the run's tag in the UI: a run is exact when
it succeeded and no check of severity ERROR failed (`checks.failed`), whichever check it is
and wherever it was evaluated. `clinical-sync sync` reads its run's events in process, the
sensors read them from the instance; `status` reads the same facts from `ops.set_results`,
which each load step records with its checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from dagster import (
    AssetCheckSeverity,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
)

from connectors.clinical_records.catalogue import ALL_ENTITIES, BY_NAME, BY_TABLE
from connectors.clinical_records.errors import ClinicalApiError
from pipelines import checks
from pipelines.checks import SETTLED, UNSETTLED
from pipelines.keys import CLINICAL_GROUP, PUBLISHED_KEY
from warehouse.errors import ModelsFailed, SourceMismatch, WarehouseLocked
from warehouse.figures import Figure

EVENTS = {
    DagsterEventType.ASSET_MATERIALIZATION,
    DagsterEventType.ASSET_CHECK_EVALUATION,
    DagsterEventType.STEP_FAILURE,
}


class Ending(StrEnum):
    EXACT = "exact"
    NOT_EXACT = "not_exact"
    FAILED = "failed"


@dataclass(frozen=True)
class CheckOutcome:
    table: str
    name: str
    passed: bool
    severity: str
    metadata: dict[str, object]


@dataclass(frozen=True)
class Failure:
    """Where a run failed and why; the message only for errors of ours, which hold no PHI."""

    steps: tuple[str, ...]
    kind: str | None
    message: str

    def __str__(self) -> str:
        where = f" in {', '.join(self.steps[:2])}" if self.steps else ""
        more = f" and {len(self.steps) - 2} more" if len(self.steps) > 2 else ""
        return f"failed{where}{more}: {self.message}"


@dataclass(frozen=True)
class SetEnding:
    """An entity set the run left not exact: the checks that failed and its figures."""

    entity: str
    failed: tuple[CheckOutcome, ...]
    unreconciled: int
    live_rows: int | None

    @property
    def differs_by(self) -> str:
        """How far off the set is, as much as the run knows: a count's difference is a floor
        (inserts and deletes cancel in it), and a set failed by other checks has none."""
        if self.unreconciled:
            return f"differs from the source by at least {self.unreconciled:,}"
        return "differs from the source by an unknown number of records"


@dataclass(frozen=True)
class Verdict:
    run_id: str
    job: str
    ending: Ending
    sets: tuple[str, ...]  # every entity set the run loaded
    not_exact: tuple[SetEnding, ...] = ()
    failure: Failure | None = None
    published: bool = False  # the run published the warehouse (a failed model does not stop it)

    @property
    def exact(self) -> bool:
        return self.ending is Ending.EXACT


def check_outcomes(events: Iterable[DagsterEvent]) -> list[CheckOutcome]:
    """Every check the run evaluated, with its figures as plain values."""
    found = []
    for event in events:
        if event.event_type is not DagsterEventType.ASSET_CHECK_EVALUATION:
            continue
        evaluation = event.event_specific_data
        found.append(
            CheckOutcome(
                table=evaluation.asset_key.path[-1],
                name=evaluation.check_name,
                passed=evaluation.passed,
                severity=evaluation.severity.value,
                metadata=values(evaluation.metadata),
            )
        )
    return found


def set_figures(events: Iterable[DagsterEvent]) -> dict[str, dict[str, Any]]:
    """Per table the run loaded, its load's metadata."""
    found = {}
    for event in events:
        key = event.asset_key if event.is_step_materialization else None
        if key is not None and key.path[0] == CLINICAL_GROUP and key.path[-1] in BY_TABLE:
            found[key.path[-1]] = values(event.materialization.metadata)
    return found


def by_set(outcomes: Iterable[CheckOutcome]) -> list[CheckOutcome]:
    """The outcomes, the run's end's (`sets_settled`, one check for every set) as one per
    set it names, so each set is told with the checks it failed."""
    found = []
    for outcome in outcomes:
        if outcome.name != SETTLED:
            found.append(outcome)
            continue
        for name in outcome.metadata:
            if name.startswith(UNSETTLED) and name[len(UNSETTLED) :] in BY_NAME:
                table = BY_NAME[name[len(UNSETTLED) :]].table
                found.append(replace(outcome, table=table))
    return found


def verdict(run_id: str, job: str, success: bool, events: Sequence[DagsterEvent]) -> Verdict:
    """How the run ended, from its events (in process, or read back from the instance)."""
    figures = set_figures(events)
    errors = by_set(checks.failing(check_outcomes(events), AssetCheckSeverity.ERROR))
    order = {e.table: i for i, e in enumerate(ALL_ENTITIES)}  # then any other asset's checks
    tables = sorted({c.table for c in errors}, key=lambda t: (order.get(t, len(order)), t))
    not_exact = tuple(
        SetEnding(
            entity=BY_TABLE[table].name if table in BY_TABLE else table,
            failed=tuple(c for c in errors if c.table == table),
            unreconciled=int(figures.get(table, {}).get(Figure.UNRECONCILED, 0)),
            live_rows=figures.get(table, {}).get(Figure.LIVE_ROWS),
        )
        for table in tables
    )
    failure = None
    if not success:
        failures = root_failures(events)
        kind, reason = safe_reason(failures[0][1]) if failures else (None, "the run failed")
        failure = Failure(tuple(step for step, _ in failures), kind, reason)
    ending = Ending.FAILED if not success else Ending.NOT_EXACT if not_exact else Ending.EXACT
    sets = tuple(e.name for e in ALL_ENTITIES if e.table in figures)
    published = any(e.is_step_materialization and e.asset_key == PUBLISHED_KEY for e in events)
    return Verdict(run_id, job, ending, sets, not_exact, failure, published)


def verdict_of_run(instance: DagsterInstance, run: Any) -> Verdict:
    """A finished run's verdict from the instance's event log (what the sensors read)."""
    events = [
        entry.dagster_event
        for entry in instance.all_logs(run.run_id, of_type=EVENTS)
        if entry.dagster_event is not None
    ]
    return verdict(run.run_id, run.job_name, run.status == DagsterRunStatus.SUCCESS, events)


def root_failures(events) -> list[tuple[str, Any]]:
    """Each failed step with the error underneath Dagster's wrapper (ours, without PHI)."""
    found = []
    for event in events:
        if event.is_step_failure and event.step_failure_data.error is not None:
            error = event.step_failure_data.error
            while error.cause is not None:  # Dagster's wrapper first, our error underneath
                error = error.cause
            found.append((event.step_key, error))
    return found


def first_failure(events) -> str:
    """The first step failure's message (the connector's errors carry no PHI)."""
    for step_key, error in root_failures(events):
        return f"{step_key}: {error.message.strip()}"
    return "the run failed"


def died(run_id: str, job: str, why: str) -> Verdict:
    """A run whose process ended without finishing (found and closed by a later run)."""
    return Verdict(run_id, job, Ending.FAILED, (), (), Failure((), None, why))


def _ours() -> set[str]:
    """The error classes whose messages hold no token, secret, document id or record."""
    found: set[str] = set()
    todo: list[type] = [ClinicalApiError, WarehouseLocked, SourceMismatch, ModelsFailed]
    while todo:
        kind = todo.pop()
        found.add(kind.__name__)
        todo.extend(kind.__subclasses__())
    return found


def kind_and_reason(error: Any) -> tuple[str, str]:
    """`AuthenticationError`, `token request refused ...` from a serialized error."""
    kind = error.cls_name or "Error"
    message = error.message.strip()
    head, _, rest = message.partition(": ")
    return kind, rest if head.rsplit(".", 1)[-1] == kind and rest else message


def safe_reason(error: Any) -> tuple[str, str]:
    """The error's class and, for our own errors, its message; another error's message may
    quote a value (a database error names the row it choked on), so it stays in the log."""
    kind, reason = kind_and_reason(error)
    if kind in _ours():
        return kind, reason
    return kind, f"{kind} (its message is in the run's log)"


def values(metadata: Any) -> dict[str, Any]:
    """Dagster metadata entries as plain values."""
    return {name: value.value for name, value in metadata.items()}
