"""The dbt project (transform/): its catalogue-made files never drift from the catalogue, its
sources are every clinical table and column with the spec's meaning, and dbt, as this product
runs it, sends nothing anywhere."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from connectors.clinical_records.catalogue import ALL_ENTITIES, CLAIMS, PRESCRIPTIONS
from tests.warehouse_records import PER_BRANCH, Harness, record
from warehouse import dbt_catalogue, dbt_project, models
from warehouse.schema import CLINICAL_META

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_files_are_what_the_catalogue_makes():
    for relative, text in dbt_catalogue.generated().items():
        held = (dbt_project.DEFAULT_PROJECT / relative).read_text(encoding="utf-8")
        assert held == text, f"{relative}: run `python -m warehouse.dbt_catalogue`"


def test_the_sources_are_every_clinical_table_and_column_with_its_meaning():
    manifest = dbt_project.manifest_json(dbt_project.prepare())
    sources = {s["name"]: s for s in manifest["sources"].values() if s["source_name"] == "clinical"}
    assert set(sources) == {e.table for e in ALL_ENTITIES}
    for entity in ALL_ENTITIES:
        columns = sources[entity.table]["columns"]
        expected = {f.name: f.meaning for f in entity.fields}
        expected |= {name: meaning for name, (_, meaning) in CLINICAL_META.items()}
        assert {n: c["description"] for n, c in columns.items()} == expected, entity.name
    tests = [
        (n["test_metadata"]["name"], n["test_metadata"]["kwargs"]["model"], n.get("column_name"))
        for n in manifest["nodes"].values()
        if n["resource_type"] == "test"
        and all(d.startswith("source.") for d in n["depends_on"]["nodes"])
    ]
    keys = [t for t in tests if t[0] == "primary_key"]
    assert {column for _, _, column in keys} == {"id"} and len(set(keys)) == len(ALL_ENTITIES)
    references = {(model, column) for name, model, column in tests if name == "relationships"}
    assert len(references) == len(dbt_catalogue.references())
    for node in manifest["nodes"].values():
        if node["resource_type"] == "test" and node["test_metadata"]["name"] == "relationships":
            assert node["config"]["severity"].lower() == "warn"  # the source has dangling ones


def test_the_project_turns_usage_reporting_off():
    project = yaml.safe_load((dbt_project.DEFAULT_PROJECT / "dbt_project.yml").read_text())
    assert project["flags"]["send_anonymous_usage_stats"] is False


def _flag_declared_here() -> str:
    from dbt_common.behavior_flags import BehaviorFlagRendered

    flag = BehaviorFlagRendered({"name": "a_flag", "default": False, "description": "-"}, {})
    return flag._behavior_change_event.flag_source


def test_a_behaviour_flag_names_its_module_without_reading_the_stack(monkeypatch):
    """dbt-common read every frame's source lines (`inspect.stack()`) to name the module of a
    flag, twice per build: the runner names the same module from the frames themselves."""
    dbt_project.runner()
    monkeypatch.setattr("inspect.stack", lambda *a, **k: pytest.fail("inspect.stack() called"))
    assert _flag_declared_here() == __name__


def test_dbt_lists_the_folders_of_sys_path_for_plugins_once_per_process(monkeypatch):
    """dbt looked for plugin modules before every command by listing every folder of
    `sys.path`; the runner keeps the first answer for the process."""
    from dbt.plugins.manager import PluginManager

    dbt_project.runner()
    found = PluginManager.get_prefixed_modules()
    monkeypatch.setattr("pkgutil.iter_modules", lambda *a: pytest.fail("sys.path listed again"))
    assert PluginManager.from_modules("clinical_records") is not None
    assert PluginManager.get_prefixed_modules() == found


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP proxy on 127.0.0.1 that answers nothing and notes every request for a host."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(20)
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(300))
                except OSError:
                    seen.append(b"?")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    server.close()


DIRECT = """
import sys
from dbt.cli.main import dbtRunner
args = ["parse", "--project-dir", sys.argv[1], "--profiles-dir", sys.argv[2],
        "--target-path", sys.argv[3], "--log-level", "none", "--send-anonymous-usage-stats"]
assert dbtRunner().invoke(args).success
"""
OURS = """
import sys
from warehouse import models
assert models.build(sys.argv[1]).ok
"""


def test_dbt_as_the_product_runs_it_sends_nothing(proxy, tmp_path):
    """Every request leaves through a proxy that notes it. dbt with its reporting on goes to
    its collector (so the proxy sees what would be sent); the product's parse and build of
    the models, with nothing telling dbt to keep quiet but the product, send nothing."""
    url, seen = proxy
    env = {
        **{k: v for k, v in os.environ.items() if "PROXY" not in k.upper() and "DBT" not in k},
        "HTTPS_PROXY": url,
        "HTTP_PROXY": url,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # a parse of its own, not a cached one
        "PYTHONPATH": str(ROOT),
    }
    profiles = dbt_project.write_profile(tmp_path / "profile", tmp_path / "warehouse.duckdb")
    direct = [dbt_project.DEFAULT_PROJECT, profiles, tmp_path / "target"]
    done = subprocess.run(
        [sys.executable, "-c", DIRECT, *map(str, direct)], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(b"CONNECT" in s for s in seen), seen  # the proxy sees dbt's reports

    seen.clear()
    harness = Harness(tmp_path / "ours")
    harness.sync(ALL_ENTITIES[0], [record(ALL_ENTITIES[0], 1)])
    harness.close()
    done = subprocess.run(
        [sys.executable, "-c", OURS, str(harness.path)], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert seen == []


def test_a_teams_project_installs_ours_as_a_package_and_both_build(tmp_path):
    """An analytics team's own project naming transform/ (here a copy) as a local package:
    installed without the network, its models and ours built, a change in ours seen."""
    ours = tmp_path / "ours"
    shutil.copytree(dbt_project.DEFAULT_PROJECT, ours, ignore=shutil.ignore_patterns("target"))
    team = tmp_path / "team"
    (team / "models").mkdir(parents=True)
    (team / "dbt_project.yml").write_text(
        "name: team_models\nversion: '1.0.0'\nconfig-version: 2\nprofile: their_own\n"
    )
    (team / "packages.yml").write_text(f"packages:\n  - local: {ours}\n")
    (team / "models" / "claims_per_branch.sql").write_text(PER_BRANCH)
    (team / "models" / "summaries.sql").write_text(
        "select count(*) as n from {{ ref('prescription_summary') }}"
    )
    harness = Harness(tmp_path / "warehouse")
    harness.sync(PRESCRIPTIONS, [record(PRESCRIPTIONS, 1), record(PRESCRIPTIONS, 2)])
    harness.sync(CLAIMS, [record(CLAIMS, 1, billing_branch_id=7)])
    project = dbt_project.prepare(team)
    built = models.build(harness.path, project)
    assert {"claims_per_branch", "summaries", "prescription_summary"} <= set(built.built)
    assert harness.rows("SELECT * FROM analytics.summaries") == [(2,)]
    assert harness.rows("SELECT * FROM analytics.claims_per_branch") == [("7", 1)]

    summary = ours / "models" / "analytics" / "prescription_summary.sql"
    summary.write_text(summary.read_text() + "\nWHERE p.id = '1'")
    assert dbt_project.prepare(team) != project  # the package's change is a new parse
    harness.close()
