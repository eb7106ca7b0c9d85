"""Data-quality checks on the clinical tables: Dagster check results over the SQL of
`warehouse/quality.py` and `warehouse/ledger.py`.

The load asset runs the checks of its own table (the count against the source at the run's
last look, reconciliation, what was set aside, staleness); each table's references are one
check, all of them in one step of their own after the tables they read are loaded, at WARN,
since the source has dangling references. Every step that evaluates checks records their
results as it yields them (`record`: ops.set_results, which `status` and
analytics.sync_health read). Freshness is Dagster's own policy on each table, which the
instance's daemon evaluates (no sensor, no check step).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import duckdb
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    FreshnessPolicy,
    map_asset_specs,
    multi_asset_check,
)

from connectors.clinical_records.catalogue import BY_NAME, BY_TABLE, EntitySet, Navigation
from pipelines.keys import table_key
from pipelines.partitions import tenant_of
from pipelines.resources import WarehouseAccess
from sync.budget import needs_whole, staleness_figure
from sync.reconcile import Reconciliation
from sync.state import LOCK_WAIT_SECONDS
from warehouse import ledger, quality, runs
from warehouse.figures import Figure, keyed_by_text
from warehouse.load import Warehouse

MATCHES_SOURCE = "row_count_matches_source"
REJECTS = "no_rejects"
RECONCILED = "reconciled_with_source"
STALENESS = "read_whole_recently"
REFERENCES = "references_found"
SETTLED = "sets_settled"  # the run's end (pipelines/exactness_asset.py), for every set
UNSETTLED = "unsettled "  # its metadata: `unsettled <set>`, requests after its last look
FRESH_WITHIN = timedelta(hours=26)
R = TypeVar("R")


def table_check_specs(entity: EntitySet) -> list[AssetCheckSpec]:
    """The checks a load step evaluates on its own table right after loading.

    Each is a question an operator acts on differently: the table differs from the source
    (report it), the source moved faster than reconciliation (run again, a quieter hour),
    something was set aside (read ops.rejects), a set without updated_at went unread. Every
    check costs a run three events and a lookup of its asset's materialization, ten tenants
    at once pay them ten times: a key held twice is one of the count check's failures, not
    a check of its own, and a value that did not fit is a note in ops.rejects like a
    rejected record."""
    key = table_key(entity)
    return [
        AssetCheckSpec(
            MATCHES_SOURCE,
            asset=key,
            description=(
                "Live rows (and rows rejected this run) equal the source's @odata.count at the "
                "run's last look at the set, after every other request to it, and no key is "
                "held twice; fails with the records missing, extra, duplicated or known stale"
            ),
        ),
        AssetCheckSpec(
            REJECTS,
            asset=key,
            description=(
                "Nothing set aside in ops.rejects this run: records not loaded (kind reject) "
                "and values that did not fit their column, null there and kept as sent in "
                "_extras (kind unfit), per field (WARN)"
            ),
        ),
        *(
            [
                AssetCheckSpec(
                    STALENESS,
                    asset=key,
                    description=(
                        "A set without updated_at was read whole recently (warns past "
                        "staleness_warn_hours; a nightly budget reads the stalest first)"
                    ),
                )
            ]
            if needs_whole(entity)
            else []
        ),
        AssetCheckSpec(
            RECONCILED,
            asset=key,
            description=(
                "The extraction ended equal to the source's count (writes during the run "
                "re-read, deletes found); fails with the difference left when the source "
                "changed faster than the reconciliation budget"
            ),
        ),
    ]


def failing(results: Iterable[R], severity: AssetCheckSeverity) -> list[R]:
    """The checks among `results` (results, or outcomes read back from a run's events) that
    failed at `severity`. One failed at ERROR makes its set, and its run, not exact,
    whichever check it is and wherever it was evaluated."""
    return [r for r in results if not r.passed and _severity(r) == severity.value]


def failed_names(results: Iterable[Any], severity: AssetCheckSeverity) -> tuple[str, ...]:
    return tuple(str(r.check_name) for r in failing(results, severity))


def record(
    con: duckdb.DuckDBPyConnection, run_id: str, entity: str, results: Iterable[AssetCheckResult]
) -> None:
    """Check results of `entity` as they were evaluated, WARN and ERROR alike, into its
    set's result of the run: the one way a step records checks (`runs.record_checks`)."""
    outcomes = [
        (str(r.check_name), r.passed, _severity(r) == AssetCheckSeverity.ERROR.value)
        for r in results
    ]
    runs.record_checks(con, run_id, entity, outcomes)


def _severity(result: Any) -> str:
    """A result's severity as its name: an enum in a result, a string in an outcome."""
    return getattr(result.severity, "value", result.severity)


def staleness_result(hours: float, threshold: float) -> AssetCheckResult:
    """Warns when the set's updates may be older than `threshold` hours."""
    return AssetCheckResult(
        check_name=STALENESS,
        passed=hours <= threshold,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"last read whole {hours:g} hours ago (warns past {threshold:g})"
            if math.isfinite(hours)
            else "never read whole"
        ),
        metadata=keyed_by_text(
            {Figure.SOURCE_STALENESS_HOURS: staleness_figure(hours), "threshold_hours": threshold}
        ),
    )


def reconciled_result(reconciliation: Reconciliation, skipped: bool) -> AssetCheckResult:
    """Passes when the set's count agreed with the keys held at the end of its extraction."""
    return AssetCheckResult(
        check_name=RECONCILED,
        passed=reconciliation.exact,
        description=(
            "not extracted this run"
            if skipped
            else f"{reconciliation.unconfirmed} records counted before the read not found"
            if reconciliation.unconfirmed
            else reconciliation.blind or "exact: inserts, updates and deletes seen"
        ),
        metadata=keyed_by_text(reconciliation.figures()),
    )


@dataclass(frozen=True)
class SourceCount:
    """A table after its load against the source's count at the run's last look at the set
    (None: not counted this run, as a backfill reads a date range only). A rejected row is
    in the source's count but not in the table; ops.rejects has it."""

    source: int | None
    live: int
    rejected: int
    duplicated: int
    stale: int = 0  # written at the source after they were read, not re-read (the budget)

    @classmethod
    def of(
        cls,
        con: duckdb.DuckDBPyConnection,
        entity: EntitySet,
        *,
        run_id: str,
        source: int | None,
        stale: int = 0,
    ) -> SourceCount:
        return cls(
            source,
            quality.live_rows(con, entity),
            ledger.run_rejects(con, entity.name, run_id),
            quality.duplicate_keys(con, entity),
            stale,
        )

    @property
    def missing(self) -> int:
        return 0 if self.source is None else max(0, self.source - self.live - self.rejected)

    @property
    def extra(self) -> int:
        return 0 if self.source is None else max(0, self.live + self.rejected - self.source)

    def figures(self) -> dict[str, int]:
        """As the run's metadata and the check's name them (-1: no count this run)."""
        return keyed_by_text(
            {
                Figure.SOURCE_COUNT: -1 if self.source is None else self.source,
                Figure.LIVE_ROWS: self.live,
                "rejected": self.rejected,
                "missing": self.missing,
                "extra": self.extra,
                "duplicated": self.duplicated,
                "stale": self.stale,
            }
        )


def table_check_results(count: SourceCount, unfit: dict[str, int]) -> list[AssetCheckResult]:
    """The count against the source (ERROR: it fails whenever they disagree, a key held
    twice included) and what was set aside (WARN)."""
    if count.source is None:
        matches = AssetCheckResult(
            check_name=MATCHES_SOURCE,
            passed=count.duplicated == 0,
            description=(
                "no count of the source this run: compared at the next one"
                + (f"; {count.duplicated} keys held twice" if count.duplicated else "")
            ),
            metadata=count.figures(),
        )
    else:
        wrong = count.missing + count.extra + count.duplicated + count.stale
        matches = AssetCheckResult(
            check_name=MATCHES_SOURCE,
            passed=wrong == 0,
            description=(
                f"{count.live} live + {count.rejected} rejected against {count.source} at the "
                f"source: {count.missing} missing, {count.extra} extra, {count.duplicated} "
                f"duplicated, {count.stale} stale"
            ),
            metadata=count.figures(),
        )
    return [matches, rejects_result(count.rejected, unfit)]


def rejects_result(rejected: int, unfit: dict[str, int]) -> AssetCheckResult:
    """Warns when this run set anything aside in ops.rejects: records not loaded, and values
    that did not fit their column (the record loaded, the value null there and kept as sent
    in `_extras`), naming the fields."""
    said = []
    if rejected:
        said.append(f"{rejected} records not loaded")
    if unfit:
        named = ", ".join(f"{name} {count}" for name, count in unfit.items())
        said.append(f"{sum(unfit.values())} values kept as sent in _extras: {named}")
    return AssetCheckResult(
        check_name=REJECTS,
        passed=not said,
        severity=AssetCheckSeverity.WARN,
        description="; ".join(said) if said else "nothing set aside: every value fits",
        metadata={
            "rejected": rejected,
            "kept_raw": sum(unfit.values()),
            **{f"field {k}": v for k, v in unfit.items()},
        },
    )


@dataclass(frozen=True)
class Reference:
    """A to-one navigation between two synced tables: `source.local` -> `target.remote`."""

    source: EntitySet
    navigation: Navigation

    @property
    def target(self) -> EntitySet:
        return BY_NAME[self.navigation.target]


def references_by_table() -> dict[EntitySet, list[Reference]]:
    """Each table's to-one navigations to synced entity sets, for the tables with some, in
    the catalogue's order."""
    found = {
        ent: [
            Reference(ent, nav) for nav in ent.navigations if not nav.many and nav.target in BY_NAME
        ]
        for ent in BY_NAME.values()
    }
    return {ent: refs for ent, refs in found.items() if refs}


def reference_checks() -> AssetChecksDefinition:
    """One reference check per table (`references_found`, WARN: the source has dangling
    references), all in one step after the tables they read: one opening of the working
    copy, which records the results, and one step's events (a run's CPU goes mostly to
    Dagster's bookkeeping per step and per check: ten tenants at once on one machine pay it
    ten times). Blocking (a WARN blocks nothing): the steps downstream of the tables, the
    publication among them, wait for it, so the copy published holds what it found."""
    by_table = references_by_table()
    specs = [
        AssetCheckSpec(
            REFERENCES,
            asset=table_key(source),
            additional_deps=sorted(
                {table_key(ref.target) for ref in refs if ref.target is not source}, key=str
            ),
            description=(
                "Each reference found in the table it names, dangling ones counted per "
                "reference (WARN: the source has some): "
                + ", ".join(
                    f"{ref.navigation.local} in {ref.target.name}.{ref.navigation.remote}"
                    for ref in refs
                )
            ),
            blocking=True,
        )
        for source, refs in by_table.items()
    ]
    tables = {table_key(source): refs for source, refs in by_table.items()}

    @multi_asset_check(specs=specs, name="references", can_subset=True)
    def check(context, warehouse: WarehouseAccess) -> Iterator[AssetCheckResult]:
        working = warehouse.working(tenant_of(context))
        with Warehouse(working, wait=LOCK_WAIT_SECONDS) as wh:
            for key in sorted(context.selected_asset_check_keys, key=str):
                result = references_result(wh.con, key.asset_key, tables[key.asset_key])
                entity = BY_TABLE[key.asset_key.path[-1]].name
                record(wh.con, context.run.run_id, entity, [result])
                yield result

    return check


def references_result(
    con: duckdb.DuckDBPyConnection, key: AssetKey, refs: Sequence[Reference]
) -> AssetCheckResult:
    """A table's references: how many each made and how many found nothing."""
    counted = {
        ref.navigation.local: quality.dangling(
            con, ref.source, ref.navigation.local, ref.target, ref.navigation.remote
        )
        for ref in refs
    }
    dangling = {local: missing for local, (_, missing) in counted.items() if missing}
    return AssetCheckResult(
        asset_key=key,
        check_name=REFERENCES,
        passed=not dangling,
        severity=AssetCheckSeverity.WARN,
        description=(
            "dangling: "
            + ", ".join(f"{local} {n} of {counted[local][0]}" for local, n in dangling.items())
            if dangling
            else "every reference found"
        ),
        metadata={
            "references": sum(total for total, _ in counted.values()),
            "dangling": sum(dangling.values()),
            **{f"dangling {local}": missing for local, (_, missing) in counted.items()},
        },
    )


def with_freshness(
    assets: Sequence[AssetsDefinition], keys: Collection[AssetKey]
) -> list[AssetsDefinition]:
    """The assets, each of `keys` expected to be loaded within the last 26 hours."""
    policy = FreshnessPolicy.time_window(fail_window=FRESH_WITHIN)

    def fresh(spec: AssetSpec) -> AssetSpec:
        return spec.replace_attributes(freshness_policy=policy) if spec.key in keys else spec

    return list(map_asset_specs(fresh, assets))
