"""What a family's extraction starts from, decided without Dagster: the run's options under
a nightly budget, and per chosen set its plan, watermark, held keys and parents. The
extraction step (pipelines/assets.py) only gathers the values these functions weigh and
logs what they decided, so that every step of a run, whenever it starts, decides alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from connectors.clinical_records.catalogue import ALL_ENTITIES, RIDES_WITH, EntitySet
from sync.budget import Coverage, allot, costs_of, needs_whole, staleness_hours
from sync.riders import SetInput
from sync.strategy import Mode, Options, Plan, SyncState, plan


class CommittedState(Protocol):
    """What the warehouse committed, as `sync.state.CommittedState` reads it."""

    def state(self, entity: EntitySet) -> SyncState: ...

    def held_keys(self, entity: EntitySet) -> set[Any]: ...

    def parents(self, entity: EntitySet, reference: str) -> dict[Any, Any]: ...


def budget_applies(options: Options, budget: int | None) -> bool:
    """A nightly budget weighs only an exact run of the usual kind: a forced snapshot or a
    backfill reads what it was asked to, whatever it costs."""
    return budget is not None and options.exact and not options.full and not options.backfill


def within_budget(
    options: Options,
    budget: int,
    rows: Mapping[str, int],
    read: Mapping[str, Coverage],
    started: datetime,
) -> tuple[Options, str]:
    """The run's options with the sets read whole this run and the key ranges read of
    others (`allot`), and the line that tells the operator what waits."""
    costs = costs_of(ALL_ENTITIES, rows, read)
    allotment = allot(costs, budget, started)
    ranges = [f"{name} ({pages} pages)" for name, pages in allotment.ranges.items()]
    waiting = [
        f"{c.entity.name} ({staleness_hours(c.read.covered_at, started):g} h stale)"
        for c in costs
        if needs_whole(c.entity) and c.entity.name not in allotment.whole
    ]
    line = (
        f"nightly budget {budget} requests: read whole "
        f"{', '.join(sorted(allotment.whole)) or 'none'}; key ranges of "
        f"{', '.join(ranges) or 'none'}; not whole: {', '.join(waiting) or 'none'}"
    )
    return replace(options, read_whole=allotment.whole, read_ranges=allotment.ranges), line


def needs_held_keys(todo: Plan) -> bool:
    """An increment or a key range reconciles against the keys the warehouse holds."""
    return todo.mode in (Mode.INCREMENTAL, Mode.RANGE)


def needs_parents(entity: EntitySet, todo: Plan) -> bool:
    """A child riding in its parent's pages, with a set of its own, whose read moves its
    watermark: a child held under a parent read whole that did not come with it is gone."""
    return entity.name in RIDES_WITH and entity.contained_in is None and todo.moves_watermark


def set_inputs(
    chosen: Iterable[EntitySet],
    committed: CommittedState,
    options: Options,
    now: datetime | None = None,
) -> dict[str, SetInput]:
    """Per chosen set, its plan and what it starts from (keys and parents read only where
    the plan uses them: they are every live row of the set)."""
    inputs = {}
    for entity in chosen:
        state = committed.state(entity)
        todo = plan(entity, state, options, now)
        one = SetInput(todo, state.watermark)
        if needs_held_keys(todo):
            one.held = committed.held_keys(entity)
        if needs_parents(entity, todo):
            one.parents = committed.parents(entity, RIDES_WITH[entity.name][1].remote)
        inputs[entity.name] = one
    return inputs
