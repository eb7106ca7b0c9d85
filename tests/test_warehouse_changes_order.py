"""analytics.changes when a load merges several versions of a key (one round each, oldest
first: warehouse/merge.py) or moves a deletion back (a snapshot that committed after a later
one): still one row per record a load changed, and a record deleted once is deleted once."""

from __future__ import annotations

from connectors.clinical_records.catalogue import CLAIMS
from tests.warehouse_records import Harness, record
from warehouse.lake import Lake


def changes(h: Harness, run_id: str) -> list[tuple]:
    return h.rows(
        'SELECT "id", "change", "changed_columns" FROM "analytics"."changes" '
        'WHERE "run_id" = ? ORDER BY "id"',
        [run_id],
    )


def test_a_load_of_several_versions_of_a_key_records_one_change_per_record(tmp_path):
    """A catch-up load of two runs' batches: claim 1 updated twice (the amount, then its
    note), claim 2 new and updated within the load, claim 3 seen again unchanged."""
    h = Harness(tmp_path)
    h.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 3)])
    first = h.write(
        CLAIMS,
        [record(CLAIMS, 1, total_claim_amount="9.99", updated_at="2026-02-03"), record(CLAIMS, 2)],
        day=1,
    )
    second = h.write(
        CLAIMS,
        [
            record(
                CLAIMS,
                1,
                total_claim_amount="9.99",
                additional_info="paid",
                updated_at="2026-02-04",
            ),
            record(CLAIMS, 2, total_claim_amount="1.50", updated_at="2026-02-04"),
            record(CLAIMS, 3),
        ],
        day=2,
    )
    loaded = h.wh.load(CLAIMS, [first, second], run_id="catch-up")
    assert (loaded.inserted, loaded.updated) == (1, 3)  # each version: its own round
    assert changes(h, "catch-up") == [
        ("1", "updated", ["total_claim_amount", "additional_info", "updated_at"]),
        ("2", "inserted", None),
    ]
    h.close()


def test_a_deletion_moved_back_by_an_earlier_snapshot_is_not_a_second_deletion(tmp_path):
    """Two snapshots without claim 2; the later one's load commits first and deletes it, the
    earlier one's then moves the deletion back to its own extraction (history in the
    source's order), which changes no record: analytics.changes says deleted once."""
    h = Harness(tmp_path)
    h.sync(CLAIMS, [record(CLAIMS, 1), record(CLAIMS, 2)], snapshot=True)
    earlier = h.write(CLAIMS, [record(CLAIMS, 1)], day=1, snapshot=True)
    later = h.write(CLAIMS, [record(CLAIMS, 1)], day=2, snapshot=True)
    for path in (later, earlier):
        info = Lake.info(path)
        h.wh.load(CLAIMS, [path], run_id=info.run_id, snapshot=True)
    deleted_at = h.rows('SELECT "_deleted_at" FROM "clinical"."claims" WHERE "id" = 2')
    assert deleted_at == [(Lake.info(earlier).extracted,)]  # moved back
    assert h.rows(
        'SELECT "id", "change", "run_id" FROM "analytics"."changes" WHERE "id" = \'2\''
    ) == [
        ("2", "inserted", "run-001"),
        ("2", "deleted", Lake.info(later).run_id),
    ]
    h.close()
