"""A load defers DuckDB's vacuum of merged-away rows until they are a fifth of the table."""

from __future__ import annotations

import duckdb
import pytest

from connectors.clinical_records.catalogue import CLAIMS
from tests.warehouse_records import Harness, record
from warehouse import vacuum

ROWS = 2_000


def stored_and_live(h: Harness) -> tuple[int, int]:
    """Rows the table stores (deleted ones included) and rows it holds, read after reopening,
    so that the checkpoint of closing has run."""
    h.close()
    h.wh.open()
    (stored,) = h.rows(
        "SELECT estimated_size FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
        ["clinical", CLAIMS.table],
    )[0]
    (live,) = h.rows('SELECT count(*) FROM "clinical"."claims"')[0]
    return stored, live


def replace_every(h: Harness, step: int, amount: str, day: int) -> None:
    changed = [record(CLAIMS, i, total_claim_amount=amount) for i in range(0, ROWS, step)]
    assert h.sync(CLAIMS, changed, day=day).updated == len(changed)


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path, entities=[CLAIMS])
    h.sync(CLAIMS, [record(CLAIMS, i) for i in range(ROWS)])
    yield h
    h.close()


def tasks(h: Harness) -> int:
    return int(h.rows(f"SELECT current_setting('{vacuum.SETTING}')")[0][0])


DUCKDB_DEFAULT = int(
    duckdb.connect().execute(f"SELECT current_setting('{vacuum.SETTING}')").fetchone()[0]
)


def test_dead_rows_stay_until_a_fifth_of_the_table_then_the_commit_vacuums(harness):
    replace_every(harness, 10, "7", day=1)  # 200 dead of 2,200 stored: 9%
    assert tasks(harness) == 0
    assert stored_and_live(harness) == (ROWS + ROWS // 10, ROWS)

    replace_every(harness, 4, "8", day=2)  # 200 + 500 dead of 2,700: 26%
    assert tasks(harness) == DUCKDB_DEFAULT > 0
    assert stored_and_live(harness) == (ROWS, ROWS)
    amounts = dict(
        harness.rows('SELECT "id", "total_claim_amount"::DOUBLE FROM "clinical"."claims"')
    )
    assert amounts[0] == amounts[4] == 8 and amounts[10] == 7
    assert amounts[1] == 1.5


def test_a_duckdb_without_the_setting_keeps_its_own_vacuum(tmp_path, monkeypatch):
    monkeypatch.setattr(vacuum, "SETTING", "a_setting_this_duckdb_lacks")
    h = Harness(tmp_path, entities=[CLAIMS])
    h.sync(CLAIMS, [record(CLAIMS, i) for i in range(ROWS)])
    replace_every(h, 10, "7", day=1)
    assert int(h.rows("SELECT current_setting('max_vacuum_tasks')")[0][0]) == DUCKDB_DEFAULT
    h.close()


@pytest.mark.parametrize(
    ("stored", "live", "due"),
    [(0, 0, False), (1000, 1000, False), (1000, 801, False), (1000, 800, True), (10, 0, True)],
)
def test_the_vacuum_is_due_at_a_fifth_of_the_stored_rows(stored, live, due):
    assert vacuum.is_due(stored, live) is due
