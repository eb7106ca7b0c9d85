"""The record of runs: `ops.sync_runs` (one row per run) and `ops.set_results` (how each set
ended in each run, with its checks), and how each set's last run ended as `status` reads it.
The tables are declared in `warehouse/ddl.py`.

Callers own the transaction, but for `fail_run`, which stands alone. `Warehouse` offers these
functions as its methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime

import duckdb

from warehouse.connection import Transaction
from warehouse.ddl import ANALYTICS, SYNC_HEALTH_VIEW
from warehouse.figures import RECONCILE_FIGURES, Figure
from warehouse.ident import qualified, quote
from warehouse.ledger import LoadResult

SUCCESS, FAILED = "success", "failed"  # ops.sync_runs statuses
RUN_FIGURES = ("fetched", "inserted", "updated", "soft_deleted", "rejected")  # summed per run


@dataclass(frozen=True)
class SetResult:
    """How one entity set ended in one run, as its load's checks found it."""

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


def record_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: Iterable[str],
    *,
    full_snapshot: bool = False,
    started_at: datetime | None = None,
) -> None:
    """The run's row; `started_at` is when the run began (default: now)."""
    con.execute(
        'INSERT INTO "ops"."sync_runs" ("run_id", "started_at", "status", "entities", '
        '"full_snapshot") VALUES (?, coalesce(?, now()), ?, ?, ?)',
        [run_id, started_at, "running", list(entities), full_snapshot],
    )


def finish_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    status: str,
    results: Mapping[str, LoadResult] | None = None,
    message: str | None = None,
) -> None:
    total = sum((results or {}).values(), LoadResult())
    figures = ", ".join(f"{quote(name)} = ?" for name in RUN_FIGURES)
    con.execute(
        f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
        '"message" = ? WHERE "run_id" = ?',
        [status, *(getattr(total, name) for name in RUN_FIGURES), message, run_id],
    )


def add_to_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: Iterable[str],
    result: LoadResult,
    *,
    full_snapshot: bool = False,
    reconciled: Mapping[str, int] | None = None,
    staleness_hours: float = 0.0,
    started_at: datetime | None = None,
) -> None:
    """Add a committed load's figures (and its extraction's `reconciled` figures, named
    as RECONCILE_FIGURES, and how stale its set is) to its run's row, created by the
    run's first load (`started_at`: when the run began, not that load); a run of several
    loads (entity sets, documents) keeps one row that names them all."""
    _ensure_run(con, run_id, list(entities), full_snapshot, started_at)
    names = (*RUN_FIGURES, *RECONCILE_FIGURES)
    figures = ", ".join(f"{quote(name)} = coalesce({quote(name)}, 0) + ?" for name in names)
    extra = reconciled or {}
    con.execute(
        f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
        '"max_staleness_hours" = greatest(coalesce("max_staleness_hours", 0), ?), '
        '"message" = NULL WHERE "run_id" = ?',
        [
            SUCCESS,
            *(getattr(result, name) for name in RUN_FIGURES),
            *(int(extra.get(name, 0)) for name in RECONCILE_FIGURES),
            float(staleness_hours),
            run_id,
        ],
    )


def fail_run(
    con: duckdb.DuckDBPyConnection, run_id: str, message: str, started_at: datetime | None = None
) -> None:
    """Mark a run failed (and so not exact), keeping what its finished loads recorded; a run
    that failed before its first load gets a row of its own. One transaction of its own."""
    with Transaction(con):
        _ensure_run(con, run_id, [], started_at=started_at)
        con.execute(
            'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, "message" = ?, '
            '"exact" = false WHERE "run_id" = ?',
            [FAILED, message, run_id],
        )


SET_RESULT_COLUMNS = (
    "run_id",
    "entity",
    "mode",
    "exact",
    Figure.UNRECONCILED,
    "failed_checks",
    "warned_checks",
    "staleness_hours",
    Figure.LIVE_ROWS,
)


def record_set_result(con: duckdb.DuckDBPyConnection, run_id: str, result: SetResult) -> None:
    """How a set ended in `run_id`, replacing what an earlier attempt of the same step
    recorded; the run is exact while each of its sets is. The caller owns the transaction
    (the load step's figures and this commit together)."""
    con.execute(
        'DELETE FROM "ops"."set_results" WHERE "run_id" = ? AND "entity" = ?',
        [run_id, result.entity],
    )
    values = {
        **{name: getattr(result, name) for name in SET_RESULT_COLUMNS if name != "run_id"},
        "run_id": run_id,
        "failed_checks": list(result.failed_checks),
        "warned_checks": list(result.warned_checks),
    }
    names = ", ".join(quote(name) for name in SET_RESULT_COLUMNS)
    marks = ", ".join("?" for _ in SET_RESULT_COLUMNS)
    con.execute(
        f'INSERT INTO "ops"."set_results" ({names}, "recorded_at") VALUES ({marks}, now())',
        [values[name] for name in SET_RESULT_COLUMNS],
    )
    con.execute(
        'UPDATE "ops"."sync_runs" SET "exact" = NOT EXISTS (SELECT 1 FROM "ops"."set_results" '
        'WHERE "run_id" = ? AND NOT "exact") WHERE "run_id" = ? AND "status" <> ?',
        [run_id, run_id, FAILED],
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


def _ensure_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    entities: list[str],
    full_snapshot: bool = False,
    started_at: datetime | None = None,
) -> None:
    """The run's row, made by the first write of the run; later writes add the sets it
    does not name yet."""
    row = con.execute(
        'SELECT "entities" FROM "ops"."sync_runs" WHERE "run_id" = ?', [run_id]
    ).fetchone()
    if row is None:
        record_run(con, run_id, entities, full_snapshot=full_snapshot, started_at=started_at)
    elif missing := [name for name in entities if name not in row[0]]:
        con.execute(
            'UPDATE "ops"."sync_runs" SET "entities" = ? WHERE "run_id" = ?',
            [[*row[0], *missing], run_id],
        )
