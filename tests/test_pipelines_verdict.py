"""How a run ended is one rule over its events: any check of severity ERROR that fails, whatever
its name or asset, makes the run not exact; a WARN never does; a failure says why only when the
error is one of ours (whose messages hold no PHI)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    DagsterInstance,
    MaterializeResult,
    asset,
    materialize,
)

from connectors.clinical_records.catalogue import CLAIMS
from connectors.clinical_records.errors import AuthenticationError
from pipelines.alerts import message
from pipelines.keys import table_key
from pipelines.verdict import Ending, SetEnding, verdict, verdict_of_run


@contextmanager
def run_of(*assets) -> Iterator[tuple[Any, DagsterInstance]]:
    """Materialize `assets` in process: the result, and the instance that stored its events."""
    with DagsterInstance.ephemeral() as instance:
        yield materialize(list(assets), instance=instance, raise_on_error=False), instance


def checked(name: str, passed: bool, severity: AssetCheckSeverity):
    """An asset of no table of ours with one check, named as no check of ours is."""

    @asset(name=name, check_specs=[AssetCheckSpec("made_up_check", asset=name)])
    def thing():
        yield MaterializeResult()
        yield AssetCheckResult(check_name="made_up_check", passed=passed, severity=severity)

    return thing


@pytest.mark.parametrize(
    ("passed", "severity", "ending"),
    [
        (False, AssetCheckSeverity.ERROR, Ending.NOT_EXACT),
        (False, AssetCheckSeverity.WARN, Ending.EXACT),
        (True, AssetCheckSeverity.ERROR, Ending.EXACT),
    ],
)
def test_any_failed_error_check_makes_a_run_not_exact(passed, severity, ending):
    with run_of(checked("anything", passed, severity)) as (result, instance):
        run = result.dagster_run
        found = verdict(run.run_id, run.job_name, result.success, result.all_events)
        # The sensors read the same from the instance.
        assert verdict_of_run(instance, instance.get_run_by_id(run.run_id)) == found
    assert found.ending is ending
    if ending is Ending.NOT_EXACT:
        (wrong,) = found.not_exact
        assert wrong.entity == "anything" and [c.name for c in wrong.failed] == ["made_up_check"]


def test_a_set_not_exact_carries_its_figures_into_the_message():
    @asset(
        key=table_key(CLAIMS),
        check_specs=[AssetCheckSpec("row_count_matches_source", asset=table_key(CLAIMS))],
    )
    def claims():
        yield MaterializeResult(metadata={"live_rows": 1500, "unreconciled": 7})
        yield AssetCheckResult(
            check_name="row_count_matches_source", passed=False, metadata={"duplicated": 2}
        )

    with run_of(claims) as (result, _):
        found = verdict(result.run_id, "nightly_sync", result.success, result.all_events)
    assert found.sets == ("Claims",)
    (wrong,) = found.not_exact
    assert (wrong.entity, wrong.unreconciled, wrong.live_rows) == ("Claims", 7, 1500)
    body = message(found, "data/warehouse.duckdb", tenant="north-clinic")
    assert "tenant north-clinic, warehouse data/warehouse.duckdb" in body["text"]
    assert (
        "- Claims: 1,500 rows, differs from the source by at least 7; failed: row_count_matches_source"
        in body["text"]
    )
    fields = body["clinical_sync"]
    assert fields["tenant"] == "north-clinic" and fields["ending"] == "not_exact"
    assert fields["not_exact"][0]["failed_checks"] == [
        {"name": "row_count_matches_source", "figures": {"duplicated": 2}}
    ]


@pytest.mark.parametrize("ours", [True, False])
def test_a_failure_says_why_only_for_errors_of_ours(ours):
    @asset
    def extract_things():
        if ours:
            raise AuthenticationError("invalid_client", "wrong CLINICAL_CLIENT_SECRET")
        raise ValueError("row 'Zoë O'Brien, 1970-01-01' did not fit")  # a record's content

    with run_of(extract_things) as (result, _):
        found = verdict(result.run_id, "nightly_sync", result.success, result.all_events)
    assert found.ending is Ending.FAILED and found.failure is not None
    assert found.failure.steps == ("extract_things",)
    text = message(found, "wh.duckdb")["text"]
    if ours:
        assert found.failure.kind == "AuthenticationError" and "invalid_client" in text
    else:
        assert found.failure.kind == "ValueError" and "Zoë" not in text
        assert "ValueError (its message is in the run's log)" in text


def test_a_set_failed_without_a_count_says_its_difference_is_unknown():
    """A count's difference is a floor (inserts and deletes cancel in it), and a set failed
    by another check has none: neither is said as a figure it is not."""
    floor = SetEnding("Claims", (), unreconciled=7, live_rows=None)
    unknown = SetEnding("Claims", (), unreconciled=0, live_rows=None)
    assert floor.differs_by == "differs from the source by at least 7"
    assert "unknown number" in unknown.differs_by and "0" not in unknown.differs_by
