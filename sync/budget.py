"""The nightly budget: which sets a run reads whole when they do not all fit.

A set without `updated_at` (Patients, Prescriptions, InsuranceVerifications, and the
documents, which ride with the patients) is exact only when read whole. When
`CLINICAL_NIGHTLY_BUDGET` is smaller than what that costs, the stalest of them are read
first; the others wait, as increments by `created_at` or not at all, and every set reports
how stale it is (`source_staleness_hours`, a check that warns past a threshold). Pure
decisions, so that every step of a run, whenever it starts, reaches the same ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from connectors.clinical_records.catalogue import (
    PAGE_SIZE,
    RIDES_WITH,
    EntitySet,
    Strategy,
)
from connectors.clinical_records.errors import ConfigError

BUDGET_VARIABLE = "CLINICAL_NIGHTLY_BUDGET"
PER_SET = 3  # a set's change mark, count and probe, besides its pages
_BUDGET = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(m|min|minutes)?\s*", re.IGNORECASE)
_EPOCH = datetime.min.replace(tzinfo=UTC)


def parse_budget(text: str | None, rate: float) -> int | None:
    """`1500` requests, or `30m` (minutes at `rate` requests per second); empty: no budget."""
    if text is None or not text.strip():
        return None
    match = _BUDGET.fullmatch(text)
    if match is None or float(match[1]) <= 0:
        raise ConfigError(
            BUDGET_VARIABLE,
            "a number of requests (1500) or of minutes at CLINICAL_RATE_LIMIT (30m)",
        )
    value = float(match[1])
    return int(value * 60 * rate) if match[2] else int(value)


@dataclass(frozen=True)
class SetCost:
    """What reading one set costs, and when it was last read whole."""

    entity: EntitySet
    rows: int
    last_whole: datetime | None

    @property
    def pages(self) -> int:
        return math.ceil(self.rows / PAGE_SIZE) + PER_SET


def needs_whole(entity: EntitySet) -> bool:
    """Exact only when read whole: no `updated_at` (the documents ride with the patients)."""
    return not entity.sees_updates and entity.strategy is not Strategy.SNAPSHOT


def reserve(costs: Sequence[SetCost]) -> int:
    """What the other sets spend: small snapshots whole, increments about a page."""
    spent = 0
    for c in costs:
        if needs_whole(c.entity):
            continue
        spent += c.pages if c.entity.strategy is Strategy.SNAPSHOT else 1 + PER_SET
    return spent


def allot(costs: Sequence[SetCost], budget: int, run_started: datetime) -> frozenset[str]:
    """The sets read whole this run: those this run already read whole (a step that loaded
    before this one asked), then the stalest first while they fit. A child riding in its
    parent's pages costs nothing when the parent is read whole; the documents alone cost
    the patients' pages (they come with the patients' keys)."""
    by_name = {c.entity.name: c for c in costs}
    wanted = [c for c in costs if needs_whole(c.entity)]

    def order(c: SetCost) -> tuple[bool, bool, datetime]:
        done = c.last_whole is not None and c.last_whole >= run_started
        return (not done, c.entity.name in RIDES_WITH, c.last_whole or _EPOCH)

    left = budget - reserve(costs)
    chosen: set[str] = set()
    for c in sorted(wanted, key=order):
        parent = RIDES_WITH[c.entity.name][0].name if c.entity.name in RIDES_WITH else None
        if parent in chosen:
            cost = 0
        elif parent is not None and c.entity.contained_in:
            cost = by_name[parent].pages if parent in by_name else c.pages
        else:
            cost = c.pages
        if cost <= left:
            chosen.add(c.entity.name)
            left -= cost
    return frozenset(chosen)


NEVER = -1.0  # staleness as metadata and ops.sync_runs write it for a set never read whole


def staleness_figure(hours: float) -> float:
    """Hours as metadata holds them: a finite number, NEVER for never read whole."""
    return NEVER if math.isinf(hours) else hours


def staleness_hours(last_whole: datetime | None, now: datetime) -> float:
    """Hours since a set without `updated_at` was last read whole (never: since forever)."""
    if last_whole is None:
        return math.inf
    return round(max(0.0, (now - last_whole).total_seconds() / 3600), 4)


def costs_of(
    entities: Sequence[EntitySet],
    rows: Mapping[str, int],
    last_whole: Mapping[str, datetime | None],
) -> list[SetCost]:
    return [SetCost(e, rows.get(e.name, 0), last_whole.get(e.name)) for e in entities]
