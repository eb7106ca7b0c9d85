"""The record of runs: `ops.sync_runs` (one row per run, written once from how the run ended)
and `ops.set_results` (how each set ended in each run: its load's figures and every check
result), and how each set's last run ended as `status` reads it. The tables are declared in
`warehouse/ddl.py`; docs/ARCHITECTURE.md, "The record of a run", says who writes what when.

A load records its set's result, never its run's verdict: a run killed after its third load
has three set results and no row until someone finds it ended (`end_run`, the first to
write it wins). Callers own the transaction, but for `end_run`, which stands alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import duckdb

from warehouse.connection import Transaction
from warehouse.ddl import ANALYTICS, SYNC_HEALTH_VIEW
from warehouse.figures import Figure
from warehouse.ident import qualified, quote

# ops.sync_runs statuses: how a run ended (a rebuild's own row: rebuilt). `unknown`: a run a
# rebuild found in the lake's batches alone; its ending, when someone finds it, replaces it.
SUCCESS, FAILED, KILLED, REBUILT, UNKNOWN = "success", "failed", "killed", "rebuilt", "unknown"
ENDED = (SUCCESS, FAILED, KILLED, REBUILT)
RUN_FIGURES = ("fetched", "inserted", "updated", "soft_deleted", "rejected")  # LoadResult's
# A set's figures in ops.set_results, summed per run in ops.sync_runs.
SET_FIGURES = (*RUN_FIGURES, Figure.RECONCILED, Figure.RECONCILE_REQUESTS, Figure.UNRECONCILED)


@dataclass(frozen=True)
class SetResult:
    """How one entity set ended in one run, as its checks found it."""

    entity: str
    mode: str
    live_rows: int
    unreconciled: int  # records by which the set may differ from the source
    failed_checks: tuple[str, ...] = ()  # severity ERROR
    warned_checks: tuple[str, ...] = ()  # severity WARN
    staleness_hours: float | None = None  # sets without updated_at only
    run_id: str = ""
    recorded_at: datetime | None = None

    @property
    def exact(self) -> bool:
        """Equal to the source by its own checks: no check of severity ERROR failed."""
        return not self.failed_checks


@dataclass(frozen=True)
class RunEnding:
    """How a run ended: what its row in ops.sync_runs says. `finished_at` None: now."""

    run_id: str
    status: str
    started_at: datetime | None
    finished_at: datetime | None = None
    entities: tuple[str, ...] = ()  # the sets it was asked for; those it loaded are added
    full_snapshot: bool = False
    message: str | None = None


def end_run(
    con: duckdb.DuckDBPyConnection,
    ending: RunEnding,
    figures: Mapping[str, int] | None = None,
    *,
    correct: bool = False,
) -> bool:
    """Write the run's row from how it ended, once: False when a row says it ended already
    (whoever found it first), unless the writer of that row `correct`s it (a publication
    that failed after its run was recorded a success). Its figures are its sets' results
    summed (`figures`: a rebuild's own); it is exact when it succeeded and every set it
    loaded ended exact. One transaction of its own."""
    with Transaction(con):
        row = con.execute(
            'SELECT "status" FROM "ops"."sync_runs" WHERE "run_id" = ?', [ending.run_id]
        ).fetchone()
        if row is not None and row[0] in ENDED and not correct:
            return False
        con.execute('DELETE FROM "ops"."sync_runs" WHERE "run_id" = ?', [ending.run_id])
        loaded = con.execute(
            f'SELECT list("entity" ORDER BY "recorded_at"), bool_and("exact"), '
            f"{', '.join(f'coalesce(sum({quote(n)}), 0)' for n in SET_FIGURES)}, "
            'coalesce(max(greatest("staleness_hours", 0)), 0) '
            'FROM "ops"."set_results" WHERE "run_id" = ?',
            [ending.run_id],
        ).fetchone()
        sets, all_exact, *sums, staleness = loaded
        summed = dict(zip(SET_FIGURES, sums, strict=True))
        if figures is not None:
            summed = {name: int(figures.get(name, 0)) for name in SET_FIGURES}
        entities = list(dict.fromkeys([*ending.entities, *(sets or [])]))
        exact = (
            None
            if ending.status in (REBUILT, UNKNOWN)
            else ending.status == SUCCESS and all_exact is not False
        )
        columns = {
            "run_id": ending.run_id,
            "started_at": ending.started_at,
            "finished_at": ending.finished_at,
            "status": ending.status,
            "entities": entities,
            "full_snapshot": ending.full_snapshot,
            **summed,
            "max_staleness_hours": staleness,
            "message": ending.message,
            "exact": exact,
        }
        names = ", ".join(quote(name) for name in columns)
        marks = ", ".join(
            "coalesce(?, now())" if name == "finished_at" else "?" for name in columns
        )
        con.execute(
            f'INSERT INTO "ops"."sync_runs" ({names}) VALUES ({marks})', list(columns.values())
        )
    return True


def run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    """The run's row as written, by column (a copy in the lake lets a rebuild keep it)."""
    found = con.execute('SELECT * FROM "ops"."sync_runs" WHERE "run_id" = ?', [run_id])
    row = found.fetchone()
    return None if row is None else dict(zip([d[0] for d in found.description], row, strict=True))


def restore_runs(con: duckdb.DuckDBPyConnection, rows: Iterable[Mapping[str, Any]]) -> int:
    """Rows of runs (a rebuild's, kept in the lake) written where none is yet; how many."""
    written = 0
    for row in rows:
        held = con.execute(
            'SELECT 1 FROM "ops"."sync_runs" WHERE "run_id" = ?', [row["run_id"]]
        ).fetchone()
        if held is None:
            names = ", ".join(quote(name) for name in row)
            marks = ", ".join("?" for _ in row)
            con.execute(
                f'INSERT INTO "ops"."sync_runs" ({names}) VALUES ({marks})', list(row.values())
            )
            written += 1
    return written


SET_RESULT_COLUMNS = (
    "run_id",
    "entity",
    "mode",
    Figure.UNRECONCILED,
    "staleness_hours",
    Figure.LIVE_ROWS,
)


def record_set_result(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    result: SetResult,
    figures: Mapping[str, int] | None = None,
) -> None:
    """How a set ended in `run_id` (its load's `figures`, named as SET_FIGURES), replacing
    what an earlier attempt of the same step recorded; its checks are recorded by
    `record_checks`. The caller owns the transaction."""
    con.execute(
        'DELETE FROM "ops"."set_results" WHERE "run_id" = ? AND "entity" = ?',
        [run_id, result.entity],
    )
    values: dict[str, Any] = {
        **{name: getattr(result, name) for name in SET_RESULT_COLUMNS if name != "run_id"},
        **{name: int((figures or {}).get(name, 0)) for name in SET_FIGURES},
        "run_id": run_id,
        Figure.UNRECONCILED: result.unreconciled,
    }
    names = ", ".join(quote(name) for name in values)
    marks = ", ".join("?" for _ in values)
    con.execute(
        f'INSERT INTO "ops"."set_results" ({names}, "exact", "failed_checks", "warned_checks", '
        f'"recorded_at") VALUES ({marks}, true, [], [], now())',
        list(values.values()),
    )


def record_checks(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entity: str,
    outcomes: Sequence[tuple[str, bool, bool]],
) -> None:
    """The one place a check's result is recorded: per check (name, passed, severity ERROR),
    in its set's result of the run (an earlier outcome of the same check replaced); a failed
    check of severity ERROR makes the set not exact, one of severity WARN is warned. A check
    of a set the run recorded no result for (its load failed) records one of its own."""
    con.execute(
        'INSERT INTO "ops"."set_results" ("run_id", "entity", "exact", "failed_checks", '
        '"warned_checks", "recorded_at") SELECT ?, ?, true, [], [], now() WHERE NOT EXISTS '
        '(SELECT 1 FROM "ops"."set_results" WHERE "run_id" = ? AND "entity" = ?)',
        [run_id, entity, run_id, entity],
    )
    held = con.execute(
        'SELECT "failed_checks", "warned_checks" FROM "ops"."set_results" '
        'WHERE "run_id" = ? AND "entity" = ?',
        [run_id, entity],
    ).fetchone()
    names = {name for name, _, _ in outcomes}
    failed = [n for n in held[0] or [] if n not in names]
    warned = [n for n in held[1] or [] if n not in names]
    failed += [name for name, passed, error in outcomes if not passed and error]
    warned += [name for name, passed, error in outcomes if not passed and not error]
    con.execute(
        'UPDATE "ops"."set_results" SET "failed_checks" = ?, "warned_checks" = ?, '
        '"exact" = ?, "recorded_at" = now() WHERE "run_id" = ? AND "entity" = ?',
        [failed, warned, not failed, run_id, entity],
    )


def mark_unsettled(con: duckdb.DuckDBPyConnection, run_id: str, entity: str, check: str) -> None:
    """A set the run's end found touched after its last look, and could not look at again:
    `check` failed (not exact), by at least one record."""
    record_checks(con, run_id, entity, [(check, False, True)])
    con.execute(
        'UPDATE "ops"."set_results" SET "unreconciled" = greatest("unreconciled", 1) '
        'WHERE "run_id" = ? AND "entity" = ?',
        [run_id, entity],
    )


def last_set_results(con: duckdb.DuckDBPyConnection) -> dict[str, SetResult]:
    """Per entity set, how its last recorded run ended: read from `analytics.sync_health`,
    so `status` and the analysts' view say the same; empty for a warehouse made before
    results were recorded."""
    names = [f.name for f in fields(SetResult)]
    try:
        rows = con.execute(
            f"SELECT {', '.join(quote(name) for name in names)} "
            f"FROM {qualified(ANALYTICS, SYNC_HEALTH_VIEW)}"
        ).fetchall()
    except duckdb.CatalogException:
        return {}
    found = {}
    for row in rows:
        values = dict(zip(names, row, strict=True))
        values["failed_checks"] = tuple(values["failed_checks"] or ())
        values["warned_checks"] = tuple(values["warned_checks"] or ())
        found[values["entity"]] = SetResult(**values)
    return found
