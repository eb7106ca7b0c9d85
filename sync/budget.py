"""The nightly budget: which sets a run reads whole, and which key ranges, when they do not
all fit.

A set without `updated_at` (Patients, Prescriptions, InsuranceVerifications, and the
documents, which ride with the patients) is exact only when read whole. When
`CLINICAL_NIGHTLY_BUDGET` is smaller than what that costs, the stalest of them are read
whole first; what is left of the budget reads a key range of the stalest of the others, from
where its last range ended (a rotation: the range read next is always the set's stalest), and
the rest wait, as increments by `created_at` or not at all. Every set reports how stale it is
(`source_staleness_hours`, a check that warns past a threshold): since when every record was
read, by a snapshot or a completed rotation. Pure decisions, so that every step of a run,
whenever it starts, reaches the same ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
class Coverage:
    """How recently a set's records were read."""

    covered_at: datetime | None = None  # every record read at or after it
    range_read_at: datetime | None = None  # the last key range read

    def done_since(self, moment: datetime) -> bool:
        """Read whole, or a range of it read, at or after `moment` (by this run)."""
        return any(t is not None and t >= moment for t in (self.covered_at, self.range_read_at))


@dataclass(frozen=True)
class SetCost:
    """What reading one set costs, and how recently its records were read."""

    entity: EntitySet
    rows: int
    read: Coverage = Coverage()

    @property
    def pages(self) -> int:
        return math.ceil(self.rows / PAGE_SIZE) + PER_SET


@dataclass(frozen=True)
class Allotment:
    """The sets a run reads whole, and the pages of a key range it reads of others."""

    whole: frozenset[str] = frozenset()
    ranges: Mapping[str, int] = field(default_factory=dict)


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


def allot(costs: Sequence[SetCost], budget: int, run_started: datetime) -> Allotment:
    """The sets read whole this run: those this run already read (a step that loaded before
    this one asked), then the stalest first while they fit. A child riding in its parent's
    pages costs nothing when the parent is read whole; the documents alone cost the
    patients' pages (they come with the patients' keys). What is left reads key ranges of
    the stalest sets that did not fit (not the documents: they have no keys to range)."""
    by_name = {c.entity.name: c for c in costs}
    wanted = [c for c in costs if needs_whole(c.entity)]

    def order(c: SetCost) -> tuple[bool, bool, datetime]:
        done = c.read.done_since(run_started)
        return (not done, c.entity.name in RIDES_WITH, c.read.covered_at or _EPOCH)

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
    ranges: dict[str, int] = {}
    for c in sorted(wanted, key=lambda c: order(c)[::2]):  # stalest, rider or not
        if c.entity.name in chosen or c.entity.contained_in or left <= PER_SET:
            continue
        pages = min(left - PER_SET, c.pages - PER_SET)
        if pages > 0:
            ranges[c.entity.name] = pages
            left -= pages + PER_SET
    return Allotment(frozenset(chosen), ranges)


NEVER = -1.0  # staleness as metadata and ops.sync_runs write it for a set never read whole


def staleness_figure(hours: float) -> float:
    """Hours as metadata holds them: a finite number, NEVER for never read whole."""
    return NEVER if math.isinf(hours) else hours


def staleness_hours(covered_at: datetime | None, now: datetime) -> float:
    """Hours since every record of a set without `updated_at` was read (never: forever)."""
    if covered_at is None:
        return math.inf
    return round(max(0.0, (now - covered_at).total_seconds() / 3600), 4)


def set_staleness(entity: EntitySet, covered_at: datetime | None, now: datetime) -> float | None:
    """Hours since every record of a set without `updated_at` was read (inf: never); None for
    the others, whose updates every run reads: they are never stale."""
    return staleness_hours(covered_at, now) if needs_whole(entity) else None


def costs_of(
    entities: Sequence[EntitySet], rows: Mapping[str, int], read: Mapping[str, Coverage]
) -> list[SetCost]:
    return [SetCost(e, rows.get(e.name, 0), read.get(e.name, Coverage())) for e in entities]
