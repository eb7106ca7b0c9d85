"""Records of a few shapes for the reconciliation's unit tests, and the read they follow."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE
from connectors.clinical_records.query import Comparison, Query
from sync.reconcile import Reconciler
from tests.sync.memory_source import MemorySource

START = datetime(2026, 1, 5, tzinfo=UTC)


def instant(second: int) -> str:
    """A date-time cursor value, `second` seconds into the test's day."""
    return (START + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")


def appointment(number: int, *, second: int | None = None, branch: str | None = "1") -> dict:
    """An appointment (string key, `updated_at` a date-time, a branch as its parent: a
    string in this set, a number in Branches)."""
    return {
        "id": f"A{number:05d}",
        "updated_at": instant(number if second is None else second),
        "branch_id": branch,
        "status": "Scheduled",
    }


def numbered(number: int, **fields: Any) -> dict:
    """A record of a set keyed by number (Physicians aside: every such set has `id`)."""
    return {"id": number, **fields}


def read_through(reconciler: Reconciler, source: MemorySource) -> None:
    """The extraction's read, as the pager does it: keyset pages in key order, each handed
    to the reconciler (one request a page, so changes can be cued between them)."""
    entity, last = source.entity, None
    while True:
        after = None if last is None else Comparison(entity.key, "gt", last)
        query = Query(entity, filter=after, orderby=[(entity.key, False)], top=PAGE_SIZE)
        page = source.read_page(query)["value"]
        reconciler.read(page)
        if len(page) < PAGE_SIZE:
            return
        last = page[-1][entity.key]


def keys_of(records: list[dict], key: str = "id") -> set[Any]:
    return {r[key] for r in records}
