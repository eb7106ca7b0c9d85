"""The names of a set's figures, defined once: the `ops` columns that sum them per run, the
Dagster metadata the UI plots run over run, the CLI's summary, `status --json` and the alert
all name them so, and a misspelt name fails at import, not as a figure silently missing.

In `warehouse/`, the lowest layer that every user (sync/, pipelines/, cli/) may import. A
member equals its string (`StrEnum`), so a dict keyed by either reads the same, and each
value is the column name DESIGN.md's tables give where there is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

V = TypeVar("V")


class Figure(StrEnum):
    """One figure of a set's run."""

    # What reconciliation found and spent (columns of ops.sync_runs, summed per run).
    RECONCILED = "reconciled"  # written or deleted at the source during the read, found
    RECONCILE_REQUESTS = "reconcile_requests"  # requests spent reconciling
    UNRECONCILED = "unreconciled"  # records by which the set may differ from the source
    # The client's counters, as the metadata names them (`API_FIGURES` in pipelines/assets.py).
    REQUESTS = "requests"
    PAGES = "pages"
    THROTTLED_429 = "throttled_429"
    RETRIES = "retries"
    WAIT_SECONDS = "wait_seconds"
    TOKEN_REFRESHES = "token_refreshes"
    # The extraction's and the load's rows (the load's as `LoadResult` holds them).
    ROWS_FETCHED = "rows_fetched"
    ROWS_INSERTED = "rows_inserted"
    ROWS_UPDATED = "rows_updated"
    ROWS_UNCHANGED = "rows_unchanged"
    ROWS_SOFT_DELETED = "rows_soft_deleted"
    ROWS_RESURRECTED = "rows_resurrected"
    ROWS_REJECTED = "rows_rejected"
    LIVE_ROWS = "live_rows"  # rows of the set not soft-deleted after the load
    SOURCE_COUNT = "source_count"  # the set's count at the run's last look (-1: none)
    SOURCE_STALENESS_HOURS = "source_staleness_hours"  # since read whole (-1: never)


RECONCILE_FIGURES = (Figure.RECONCILED, Figure.RECONCILE_REQUESTS, Figure.UNRECONCILED)
"""What the extractions' reconciliation found and spent, summed per run in ops.sync_runs."""


def keyed_by_text(figures: Mapping[str, V]) -> dict[str, V]:
    """The same figures keyed by plain strings: Dagster's serializer refuses an enum it was
    not told of, so metadata crosses into Dagster through this."""
    return {str(name): value for name, value in figures.items()}
