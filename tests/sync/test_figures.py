"""The figure names, defined once (`warehouse/figures.py`): every place that writes or reads
a figure agrees with the columns that keep it and the objects that hold it."""

from __future__ import annotations

from dataclasses import fields

from connectors.clinical_records.meter import Counters
from pipelines.assets import API_FIGURES, LOAD_FIGURES, extraction_metadata, run_figures
from pipelines.runner import SUMMARY_COLUMNS
from sync.extract import Extraction
from sync.reconcile import Reconciliation
from sync.strategy import Mode
from warehouse.ddl import OPS_TABLES
from warehouse.figures import RECONCILE_FIGURES, Figure, keyed_by_text
from warehouse.ledger import LoadResult
from warehouse.runs import SET_RESULT_COLUMNS, SetResult


def test_a_figure_is_its_name() -> None:
    assert Figure.UNRECONCILED == "unreconciled" and {"live_rows": 1}[Figure.LIVE_ROWS] == 1
    assert f"{Figure.THROTTLED_429}" == "throttled_429"  # as text in SQL and messages


def test_the_run_figures_are_columns_of_sync_runs() -> None:
    _, columns = OPS_TABLES["sync_runs"]
    assert set(RECONCILE_FIGURES) <= set(columns)
    assert set(run_figures(Reconciliation(caught_up=2, residual=1))) == set(RECONCILE_FIGURES)


def test_a_set_result_is_kept_under_its_figures_names() -> None:
    _, columns = OPS_TABLES["set_results"]
    names = {f.name for f in fields(SetResult)} | {"exact"}  # exact: derived
    assert set(SET_RESULT_COLUMNS) <= set(columns) and set(SET_RESULT_COLUMNS) <= names


def test_the_figures_read_from_counters_and_loads_exist_there() -> None:
    assert set(API_FIGURES) <= {f.name for f in fields(Counters) if not f.name.startswith("_")}
    assert set(LOAD_FIGURES.values()) <= {f.name for f in fields(LoadResult)}


def test_the_summary_shows_figures_the_load_step_publishes() -> None:
    published = {*API_FIGURES.values(), *LOAD_FIGURES, *RECONCILE_FIGURES, Figure.LIVE_ROWS}
    shown = {key for key, _ in SUMMARY_COLUMNS if key not in ("entity", "mode")}
    assert shown <= published
    assert all(isinstance(key, Figure) for key in shown)


def test_reconciliations_metadata_names_its_figures_alike() -> None:
    figures = Reconciliation(caught_up=2, inserted=1, requests=7).figures()
    assert figures[Figure.RECONCILED] == 3 and figures[Figure.RECONCILE_REQUESTS] == 7


def test_metadata_reaches_dagster_keyed_by_plain_strings() -> None:
    """Dagster's serializer refuses an enum it was not told of (a run failed on it)."""
    keyed = keyed_by_text({Figure.REQUESTS: 3, "mode": "snapshot"})
    assert keyed == {"requests": 3, "mode": "snapshot"}
    assert all(type(key) is str for key in keyed)
    metadata = extraction_metadata(Extraction("Branches", Mode.SNAPSHOT, "small", "run"))
    assert all(type(key) is str for key in metadata) and metadata["rows_fetched"] == 0
