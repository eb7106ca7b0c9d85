"""What the commands print, shared by them: a table, a warehouse's status (text and the
`status --json` object; its sets and its dbt models), and what became of a run's alert."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from warehouse.figures import Figure

if TYPE_CHECKING:
    from pipelines.webhook import Delivery
    from warehouse.load import EntityStatus
    from warehouse.models import Health


def tell(line: str) -> None:
    """A line for the operator while a command works: that it waits, what it found."""
    print(f"clinical-sync: {line}", file=sys.stderr, flush=True)


def status_text(states: Sequence[EntityStatus]) -> str:
    """The table, under a line that says so when a set's last run did not end exact."""
    return "\n".join([*not_exact_lines(states), status_table(states)])


def not_exact_lines(states: Sequence[EntityStatus]) -> list[str]:
    """The line above the table when a set's last run did not end equal to the source."""
    wrong = [s for s in states if s.last_result is not None and not s.last_result.exact]
    if not wrong:
        return []
    named = ", ".join(
        f"{s.entity} (by {s.last_result.unreconciled:,}; {', '.join(s.last_result.failed_checks)})"
        for s in wrong
        if s.last_result is not None
    )
    return [f"NOT EXACT: {len(wrong)} entity sets may differ from the source: {named}"]


def status_table(states: Sequence[EntityStatus]) -> str:
    """Per entity set; `rows` are live rows, as in the sync's summary and the demo's; `kept
    raw`, records loaded with a value that did not fit its column (in `_extras`)."""
    rows = [
        (
            "entity set",
            "rows",
            "deleted",
            "rejects",
            "kept raw",
            "watermark",
            "last run",
            "loaded at",
            "exact",
            "differs by",
            "failed checks",
            "stale h",
        )
    ]
    for s in states:
        result = s.last_result
        rows.append(
            (
                s.entity,
                f"{s.rows - s.deleted:,}",
                f"{s.deleted:,}",
                f"{s.rejects:,}",
                f"{s.unfit:,}",
                s.watermark or "-",
                (s.last_run_id or "-")[:8],
                _when(s.last_loaded_at),
                "-" if result is None else "yes" if result.exact else "NO",
                "-" if result is None else f"{result.unreconciled:,}",
                ", ".join(result.failed_checks) if result and result.failed_checks else "-",
                _hours(result.staleness_hours if result else None),
            )
        )
    return format_table(rows)


def _hours(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if value < 0 else f"{value:,.1f}"


def status_json(
    states: Sequence[EntityStatus], path: str | Path, tenant: str | None = None
) -> dict[str, object]:
    """`status --json`: the keys are a contract (docs/operators/running.md), added to, never renamed."""
    results = [s.last_result for s in states if s.last_result is not None]
    sets = []
    for s in states:
        result = s.last_result
        sets.append(
            {
                "entity": s.entity,
                "table": s.table,
                "rows": s.rows - s.deleted,
                "deleted": s.deleted,
                "rejects": s.rejects,
                "kept_raw": s.unfit,
                "watermark": s.watermark,
                "last_run_id": s.last_run_id,
                "last_loaded_at": s.last_loaded_at.isoformat() if s.last_loaded_at else None,
                "exact": result.exact if result else None,
                Figure.UNRECONCILED: result.unreconciled if result else None,
                "failed_checks": list(result.failed_checks) if result else [],
                "warned_checks": list(result.warned_checks) if result else [],
                "staleness_hours": result.staleness_hours if result else None,
            }
        )
    return {
        "warehouse": str(path),
        "tenant": tenant,
        "exact": all(r.exact for r in results) if results else None,
        "not_exact": [s.entity for s in states if s.last_result and not s.last_result.exact],
        "entity_sets": sets,
    }


def models_table(found: Sequence[Health]) -> str:
    """Per dbt model: its table's rows and build, stale when a table it reads changed since
    (its build failed, or no run built it), and its last failure while it stands."""
    rows = [("model", "rows", "built at", "fresh", "changed since built", "failed")]
    for m in found:
        rows.append(
            (
                m.name,
                "-" if m.rows is None else f"{m.rows:,}",
                _when(m.built_at),
                "STALE" if m.stale else "yes",
                ", ".join(m.changed_since_built) or "-",
                (m.failure or "-") if m.failing else "-",
            )
        )
    return format_table(rows)


def models_json(found: Sequence[Health]) -> list[dict[str, object]]:
    return [
        {
            "model": m.name,
            "rows": m.rows,
            "built_at": m.built_at.isoformat() if m.built_at else None,
            "stale": m.stale,
            "changed_since_built": list(m.changed_since_built),
            "failure": m.failure if m.failing else None,
        }
        for m in found
    ]


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def alert_lines(delivery: Delivery | None) -> list[str]:
    """What became of the run's message, when one was due (no URL: the host alone)."""
    return [] if delivery is None else [f"  alert: {delivery}"]


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"
