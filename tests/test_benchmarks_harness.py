"""The benchmark harness cannot rot: dlt's side runs against a real sandbox, the measurement
sees its process, and the ground-truth comparison finds what it should (and nothing else).
"""

from __future__ import annotations

import ast
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from benchmarks.common import RESULTS
from benchmarks.e2e_vs_dlt import parse_sync_table
from benchmarks.expansion_cost import parse_args as expansion_args
from benchmarks.measure import (
    child_env,
    last_json_line,
    minimum_pages,
    run_measured,
    server_figures,
)
from benchmarks.run_all import scripts
from benchmarks.truth import compare_set, compare_warehouse, key_types, type_drift
from connectors.clinical_records.catalogue import CLAIMS, ENTITY_SETS, PAGE_SIZE, Canonical
from connectors.sandbox.server import SandboxServer

DLT_SOURCE = Path(__file__).resolve().parents[1] / "benchmarks" / "dlt_source.py"


def claim(id_: object, amount: object, updated: object = "2026-01-02") -> dict[str, object]:
    return {"id": id_, "total_claim_amount": amount, "updated_at": updated, "svc_rcm": True}


def test_comparison_reads_both_sides_in_the_canonical_types() -> None:
    source = [claim(1, "12.50"), claim(2, "3.10"), claim(3, "7.00"), claim(4, "1.00")]
    loaded = [
        claim(1, Decimal("12.5000")),  # exact decimal, other scale: equal
        claim("2", 3.1),  # float money and a text key: equal values, not a difference
        claim(3, "7.01"),  # a changed value
        claim(5, "1.00"),  # deleted at the source, still loaded
    ]
    diff = compare_set(CLAIMS, source, loaded)
    assert (diff.missing, diff.extra, diff.changed) == (1, 1, 1)
    assert dict(diff.fields) == {"total_claim_amount": 1}
    assert not diff.equal


def test_comparison_compares_instants_not_spellings() -> None:
    from connectors.clinical_records.catalogue import APPOINTMENTS

    source = [{"id": "A1", "updated_at": "2026-10-31T16:59:57.1234567-07:00"}]
    same = [{"id": "A1", "updated_at": datetime(2026, 10, 31, 23, 59, 57, 123456, tzinfo=UTC)}]
    later = [{"id": "A1", "updated_at": "2026-10-31T23:59:58Z"}]
    assert compare_set(APPOINTMENTS, source, same).equal
    assert compare_set(APPOINTMENTS, source, later).fields["updated_at"] == 1


def test_floor_is_whole_pages_per_set() -> None:
    counts = {e.name: 0 for e in ENTITY_SETS} | {"Patients": PAGE_SIZE + 1, "Claims": PAGE_SIZE}
    assert minimum_pages(counts) == 3


def test_our_sync_table_is_summed_by_column() -> None:
    table = "\n".join(
        [
            "entity set  mode      fetched  rows  requests  429s  retries  wait s",
            "----------  --------  -------  ----  --------  ----  -------  ------",
            "Patients    snapshot    2,000  2,000       21     2        3     0.6",
            "Claims      snapshot    3,000  3,000       31     0        1     0.7",
            "total                                      52",
            "run 9a52f0a0: 52 requests in 18.2 s",
        ]
    )
    assert parse_sync_table(table) == {"429s": 2, "retries": 4}


@pytest.mark.integration
def test_dlt_side_loads_the_truth_then_keeps_deleted_rows(
    fresh_sandbox: SandboxServer, tmp_path: Path
) -> None:
    env = child_env(fresh_sandbox.env())
    control = fresh_sandbox.control()
    warehouse = tmp_path / "dlt.duckdb"
    cmd = [sys.executable, str(DLT_SOURCE), "--duckdb", str(warehouse)]
    cmd += ["--pipelines-dir", str(tmp_path / "pipelines")]

    before = control.stats()
    full = run_measured(cmd, env, tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    seen = server_figures(before, control.stats())
    truth = control.truth()
    counts = {e.name: len(truth[e.name]) for e in ENTITY_SETS}
    assert seen.requests == minimum_pages(counts)  # offset paging: exactly the whole pages
    assert seen.http_429 == 0 and seen.retries == 0
    assert full.peak_rss_mib > 0 and full.cpu_seconds > 0
    assert sum(last_json_line(full.stdout)["rows"].values()) == sum(counts.values())
    assert all(d.equal for d in compare_warehouse(warehouse, truth, live_only=False).values())
    # equal values, but dlt infers its own types: decimals stay text, keys differ across sets
    assert type_drift(warehouse)[f"{Canonical.DECIMAL.value} as VARCHAR"] > 0
    assert key_types(warehouse)["patient"] == {"BIGINT", "VARCHAR"}

    changes = control.advance(seconds=86400, delete_fraction=0.05, update_fraction=0.05)
    again = run_measured(cmd, env, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    diffs = compare_warehouse(warehouse, control.truth(), live_only=False)
    deleted = {name: c["deleted"] for name, c in changes.items()}
    assert sum(deleted.values()) > 0
    assert {name: d.extra for name, d in diffs.items()} == deleted  # merge keeps them all


@pytest.mark.integration
def test_dlt_side_lists_documents_once_per_patient(
    fresh_sandbox: SandboxServer, tmp_path: Path
) -> None:
    """`--documents`: one listing request per patient (dlt's `resolve`), documents loaded."""
    env = child_env(fresh_sandbox.env())
    control = fresh_sandbox.control()
    warehouse = tmp_path / "dlt.duckdb"
    cmd = [sys.executable, str(DLT_SOURCE), "--duckdb", str(warehouse), "--documents"]
    cmd += ["--pipelines-dir", str(tmp_path / "pipelines")]

    before = control.stats()
    run = run_measured(cmd, env, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = server_figures(before, control.stats())
    truth = control.truth()
    counts = {e.name: len(truth[e.name]) for e in ENTITY_SETS}
    assert seen.requests == minimum_pages(counts) + counts["Patients"]
    assert truth["Documents"]
    diffs = compare_warehouse(warehouse, truth, live_only=False, documents=True)
    assert all(d.equal for d in diffs.values()), {n: d.describe() for n, d in diffs.items()}


@pytest.mark.integration
def test_expansion_cost_prints_every_run_side_by_side(tmp_path: Path) -> None:
    """benchmarks/expansion_cost.py end to end at a tiny size: naive, ours full (documents
    included), dlt full, ours nightly, each with its ratio, wall time and truth check, and a
    verdict per target (today's figures may FAIL them: the script must measure, not pass)."""
    script = DLT_SOURCE.parent / "expansion_cost.py"
    cmd = [sys.executable, str(script), "--scale", "0.05", "--rate", "100"]
    cmd += ["--variants", "resolved"]
    recorded = RESULTS.read_bytes()
    run = run_measured(cmd, child_env({}), tmp_path, timeout=240)
    assert RESULTS.read_bytes() == recorded  # figures are kept only when asked (--record)
    assert run.returncode in (0, 1), run.stderr[-2000:]
    lines = run.stdout.splitlines()
    for name in ("naive", "ours full", "dlt full", "ours nightly"):
        assert any(line.startswith(name) for line in lines), run.stdout
    full = next(line for line in lines if line.startswith("ours full")).split()
    assert full[-1] == "yes"  # a full sync equals the truth, documents included
    dlt = lines.index(next(line for line in lines if line.startswith("dlt full")))
    assert "FAILED" not in lines[dlt + 1]  # dlt finishes, under its own limits:
    assert "sandbox for this run: 50/s, burst 50, tokens living 3600 s" in lines[dlt + 1]
    verdicts = [line.split()[0] for line in lines if "naive" in line and "<=" in line]
    assert verdicts and set(verdicts) <= {"PASS", "FAIL"}


@pytest.mark.integration
def test_tenants_parallel_measures_and_shows_each_tenants_steps(tmp_path: Path) -> None:
    """benchmarks/tenants_parallel.py end to end at a tiny size: both tenants side by side
    within their limits, the ratio against the slowest alone, and with --timeline each
    tenant's steps, its reads starting at another family (`sync --all-tenants`' rotation)."""
    script = DLT_SOURCE.parent / "tenants_parallel.py"
    cmd = [sys.executable, str(script), "--tenants", "2", "--scale", "0.02", "--rate", "10"]
    cmd += ["--timeline"]
    recorded = RESULTS.read_bytes()
    run = run_measured(cmd, child_env({}), tmp_path, timeout=300)
    assert RESULTS.read_bytes() == recorded  # figures are kept only when asked (--record)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = dict(line.split(maxsplit=1) for line in run.stdout.splitlines() if "  " in line)
    assert figures["tenants_requesting_at_once_max"].strip() == "2"
    assert figures["every_window_within_limit"].strip() == "True"
    assert float(figures["ratio_all_to_slowest_alone"]) > 0
    steps = {
        line.split(":")[0].strip(): line.split(":", 1)[1]
        for line in run.stdout.splitlines()
        if line.startswith("  clinic-")
    }
    assert sorted(steps) == ["clinic-1", "clinic-2"], run.stdout
    firsts = {name: listed.split()[0] for name, listed in steps.items()}
    assert firsts == {"clinic-1": "extract_appointment_types", "clinic-2": "extract_branches"}
    assert "cores busy, % each second:" in run.stdout


def test_expansion_cost_refuses_a_rate_its_targets_cannot_use() -> None:
    """Its wall-time targets divide by the rate, and ours needs a limit: 0 is refused."""
    assert expansion_args(["--rate", "5"]).rate == 5
    with pytest.raises(SystemExit):
        expansion_args(["--rate", "0"])


def test_key_types_builds_every_layout_and_they_answer_alike(tmp_path) -> None:
    """benchmarks/key_types.py: the same records under main's typing and today's, as views
    and as the tables a run builds, give the same answers from every model; their ids are
    typed as each rule says, and building the tables is measured in a child process."""
    import duckdb

    from benchmarks.key_types import QUERIES, files, measure

    paths, builds = files(tmp_path, scale=0.05)
    seconds, answers = measure(paths, repeats=1)
    assert answers["before"] == answers["views"] == answers["after"]
    assert all(len(s) == 1 for by_model in seconds.values() for s in by_model.values())
    assert answers["after"]["prescription_claims"][0][0] > 0  # claims joined their prescriptions
    assert len(builds["tables"]) == 2 and builds["tables"][0]["largest_rss_mib"] > 0
    held = {}
    for name in ("before", "after"):
        with duckdb.connect(str(paths[name]), read_only=True) as con:
            held[name] = (
                con.execute(
                    "SELECT data_type FROM duckdb_columns() WHERE table_name = 'claims' "
                    "AND column_name = 'prescription_id'"
                ).fetchone()[0],
                con.execute(  # the models' tables (analytics.changes is the load's)
                    "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'analytics' "
                    "AND table_name IN (SELECT unnest(?))",
                    [list(QUERIES)],
                ).fetchone()[0],
            )
    assert held == {"before": ("BIGINT", 0), "after": ("VARCHAR", len(QUERIES))}


def test_every_benchmark_records_its_figures_only_when_asked() -> None:
    """A benchmark run for a look (or by a test) leaves benchmarks/results.json as it was:
    each script's `record(...)` stands under `if args.record:`, run_all.py's `--record`."""
    unguarded = []
    for name in scripts():
        tree = ast.parse((RESULTS.parent / f"{name}.py").read_text(encoding="utf-8"))
        guarded = {
            id(node)
            for branch in ast.walk(tree)
            if isinstance(branch, ast.If) and ast.unparse(branch.test) == "args.record"
            for node in ast.walk(branch)
        }
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "record"
        ]
        assert calls, f"{name} records nothing"
        unguarded += [f"{name}:{c.lineno}" for c in calls if id(c) not in guarded]
    assert unguarded == []


def test_year_of_nights_drives_days_through_the_nightly_and_writes_its_summary(
    tmp_path: Path,
) -> None:
    """benchmarks/year_of_nights.py at a tiny size for a few nights: every night measured,
    history growing night by night, dead space under a fifth of the file, the warehouse's
    live records the source's, and the JSON's summary keys sane."""
    import json

    script = DLT_SOURCE.parent / "year_of_nights.py"
    out = tmp_path / "year.json"
    # scale 0.2 over five nights: on night 3 a patient with a document is deleted, whose
    # document the warehouse must mark deleted as the nightly does (the API reaches it no more)
    cmd = [sys.executable, str(script), "--scale", "0.2", "--days", "5", "--json", str(out)]
    run = run_measured(cmd, child_env({}), tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    year = json.loads(out.read_text())
    assert year["equals_source"] is True
    assert [n["night"] for n in year["nights"]] == [1, 2, 3, 4, 5]
    assert all(n["changes"] > 0 and n["warehouse_s"] > 0 for n in year["nights"])
    history = [n["history_rows"] for n in year["nights"]]
    assert history == sorted(history) and history[-1] > history[0] > 0
    assert year["window"] == 2 and year["first_30_nights_s"] > 0 and year["last_30_nights_s"] > 0
    assert year["file_mib_first"] > 0 and year["file_mib_last"] > 0
    assert 0 <= year["dead_space_fraction_max"] < 0.2
    assert "live records equal the source's: yes" in run.stdout
    # the ends side by side: copies after the first sync and after night 5, each taking the
    # days that followed it there, alternately; the first of each not counted
    side = year["side_by_side"]
    assert [n["night"] for n in side["first_nights"]] == [1, 2, 3, 4, 5]
    assert [n["night"] for n in side["last_nights"]] == [6, 7, 8, 9, 10]
    assert side["nights"] == 4 and side["first_s"] > 0 and side["last_s"] > 0
    assert side["ratio"] == round(side["last_s"] / side["first_s"], 2)
    assert all(n["changes"] > 0 for n in side["first_nights"] + side["last_nights"])
    # the first end's nights are the year's first nights again, on the same records
    assert [n["changes"] for n in side["first_nights"]] == [
        n["changes"] for n in year["nights"][:5]
    ]
    assert "side by side, 4 nights after each end" in run.stdout


def biggest_customer(*args: str) -> tuple[list[str], dict[str, str]]:
    script = DLT_SOURCE.parent / "biggest_customer.py"
    env = child_env({})
    env.pop("WAREHOUSE_MEMORY_LIMIT", None)  # it measures the default
    return [sys.executable, str(script), "--scales", "0.05", *args], env


@pytest.mark.integration
@pytest.mark.timeout(900)  # two syncs and a sandbox: a minute alone, more on a shared machine
def test_biggest_customer_runs_full_day_and_nightly_side_by_side(tmp_path: Path) -> None:
    """benchmarks/biggest_customer.py at a tiny size: a full sync, the day of changes and a
    nightly, each measured, with the default memory cap and no failure."""
    cmd, env = biggest_customer("--repeat", "1")
    run = run_measured(cmd, env, tmp_path, timeout=840)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "memory limit by default on this machine: " in run.stdout
    for stage in ("full", "day of changes (source)", "nightly"):
        assert any(line.strip().startswith(stage) for line in run.stdout.splitlines()), stage
    assert "1 runs, 0 failed" in run.stdout
    row = run.stdout.strip().splitlines()[-1].split()
    assert row[0] == "0.05" and row[-1] == "0" and int(row[2].replace(",", "")) > 0


def test_biggest_customer_builds_the_models_alone_under_the_default_cap(tmp_path: Path) -> None:
    """`--models-builds`: the step that ran out of memory at scale 300, on records made in
    SQL, in a child process, then published."""
    cmd, env = biggest_customer("--models-builds", "1")
    run = run_measured(cmd, env, tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 builds, 0 failed" in run.stdout
