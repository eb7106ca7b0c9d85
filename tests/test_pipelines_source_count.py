"""The count check (`row_count_matches_source`, severity ERROR): a table after its load
against the source's count at the run's last look at the set. It is evaluated after every
run that counted the set, snapshot or increment, and fails whenever the two disagree: one
record missing, one too many, one held twice or one known stale is enough. Over a real
warehouse that a real sync loaded from a sandbox."""

from __future__ import annotations

import shutil

import duckdb
import pytest

from connectors.clinical_records.catalogue import CLAIMS, PATIENTS
from pipelines.checks import MATCHES_SOURCE, SourceCount, rejects_result, table_check_results
from tests.test_pipelines_e2e import Target
from warehouse.ident import qualified, quote

pytestmark = pytest.mark.e2e


@pytest.fixture
def warehouse(fresh_sandbox, tmp_path):
    """A copy of a synced warehouse to break, the run's id and the source's counts."""
    target = Target(fresh_sandbox, tmp_path)
    report = target.sync(full=True)
    with fresh_sandbox.store.lock:
        counts = fresh_sandbox.store.counts()
    copy = tmp_path / "broken.duckdb"
    shutil.copy(target.warehouse, copy)
    with duckdb.connect(str(copy)) as con:
        yield con, report.run_id, counts


def count_check(con, entity, run_id, source, stale=0):
    count = SourceCount.of(con, entity, run_id=run_id, source=source, stale=stale)
    (check,) = [r for r in table_check_results(count, {}) if r.check_name == MATCHES_SOURCE]
    return check, count


def test_the_warehouse_as_loaded_matches(warehouse):
    con, run_id, counts = warehouse
    for entity in (CLAIMS, PATIENTS):
        check, count = count_check(con, entity, run_id, counts[entity.name])
        assert check.passed and count.figures()["missing"] == 0, check.description


@pytest.mark.parametrize("how", ["deleted", "soft-deleted"])
def test_one_record_missing_fails(warehouse, how):
    con, run_id, counts = warehouse
    table, key = qualified("clinical", CLAIMS.table), quote(CLAIMS.key)
    if how == "deleted":
        con.execute(f"DELETE FROM {table} WHERE {key} = (SELECT min({key}) FROM {table})")
    else:
        con.execute(
            f"UPDATE {table} SET _deleted_at = now() WHERE {key} = (SELECT max({key}) FROM {table})"
        )
    check, count = count_check(con, CLAIMS, run_id, counts[CLAIMS.name])
    assert not check.passed and check.severity.value == "ERROR"
    assert (count.missing, count.extra, check.metadata["missing"].value) == (1, 0, 1)


def test_one_record_too_many_held_twice_or_stale_fails(warehouse):
    con, run_id, counts = warehouse
    source = counts[CLAIMS.name]
    check, count = count_check(con, CLAIMS, run_id, source - 1)  # deleted at the source
    assert not check.passed and count.extra == 1
    check, _ = count_check(con, CLAIMS, run_id, source, stale=1)
    assert not check.passed
    table, key = qualified("clinical", CLAIMS.table), quote(CLAIMS.key)
    con.execute(
        f"INSERT INTO {table} SELECT * FROM {table} WHERE {key} = (SELECT min({key}) FROM {table})"
    )
    con.execute(f"DELETE FROM {table} WHERE {key} = (SELECT max({key}) FROM {table})")
    check, count = count_check(con, CLAIMS, run_id, source)
    assert not check.passed and (count.missing, count.duplicated) == (0, 1)
    check, _ = count_check(con, CLAIMS, run_id, None)  # not counted this run: only duplicates
    assert not check.passed
    assert "1 keys held twice" in check.description


@pytest.mark.parametrize(
    ("rejected", "unfit", "said"),
    [
        (0, {}, "nothing set aside: every value fits"),
        (2, {}, "2 records not loaded"),
        (0, {"dob": 3}, "3 values kept as sent in _extras: dob 3"),
        (1, {"dob": 1, "code": 2}, "1 records not loaded; 3 values kept as sent in _extras: dob 1"),
    ],
)
def test_what_was_set_aside_warns_with_both_kinds_named(rejected, unfit, said):
    check = rejects_result(rejected, unfit)
    assert check.passed == (not rejected and not unfit)
    assert check.severity.value == "WARN" and check.description.startswith(said)
    figures = {name: value.value for name, value in check.metadata.items()}
    assert figures == {
        "rejected": rejected,
        "kept_raw": sum(unfit.values()),
        **{f"field {name}": n for name, n in unfit.items()},
    }
