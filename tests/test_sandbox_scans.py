"""The sandbox keeps a filter's scan while its table stands still (a read's `$skip` windows
and its count ask the same one page after page) and never answers from one a change made
stale."""

from __future__ import annotations

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS
from connectors.sandbox.odata import parse_query, run_collection
from connectors.sandbox.table import Table

NULLS = {"$filter": "patient_id eq null", "$orderby": "id asc", "$top": "10"}


def _table() -> Table:
    rows = [{"id": f"a{i:03d}", "patient_id": None if i % 3 else f"p{i}"} for i in range(90)]
    return Table(APPOINTMENTS, rows)


def _ids(table: Table, **params: str) -> tuple[list[str], int | None]:
    page = run_collection(parse_query({**NULLS, **params}, APPOINTMENTS), APPOINTMENTS, table, None)
    return [r["id"] for r in page.records], page.count


def test_a_window_reads_from_the_scan_its_count_made():
    table = _table()
    first, count = _ids(table, **{"$count": "true"})
    assert count == 60 and first == [f"a{i:03d}" for i in range(90) if i % 3][:10]
    calls = []
    table.scanned(("spy",), lambda: calls.append(1) or [])
    window, _ = _ids(table, **{"$skip": "10"})
    assert window == [f"a{i:03d}" for i in range(90) if i % 3][10:20]
    assert len(table._scans) == 2 and calls == [1]  # the count's scan, kept, and the spy's


def test_a_change_between_two_windows_is_in_the_second():
    table = _table()
    _ids(table, **{"$count": "true"})
    _ids(table, **{"$skip": "10"})
    table.upsert({"id": "a000", "patient_id": None})  # now matches, first in key order
    table.upsert({"id": "a050", "patient_id": "p50"})  # no longer matches
    matching = [f"a{i:03d}" for i in range(90) if (i % 3 or i == 0) and i != 50]
    window, _ = _ids(table, **{"$skip": "10"})
    assert window == matching[10:20]
    _, count = _ids(table, **{"$count": "true"})
    assert count == 60


def test_keys_or_joined_match_as_each_equality_would():
    """A hundred `id eq` terms or-joined are one set lookup a row (a scan of a million rows
    took over the client's minute as a hundred calls a row); the answer is the same."""

    rows = [{"id": i, "patient_id": None} for i in range(1, 400)] + [{"id": "x7"}]
    table = Table(CLAIMS, rows)
    wanted = list(range(3, 400, 5))  # 80 keys: one page
    text = " or ".join(f"id eq {k}" for k in wanted) + " or id eq 1000"
    query = parse_query({"$filter": text, "$top": "100", "$count": "true"}, CLAIMS)
    page = run_collection(query, CLAIMS, table, None)
    assert [r["id"] for r in page.records] == wanted and page.count == len(wanted)
    mixed = parse_query({"$filter": "id eq 5 or id eq 9 or id gt 397", "$top": "10"}, CLAIMS)
    assert [r["id"] for r in run_collection(mixed, CLAIMS, table, None).records] == [5, 9, 398, 399]
