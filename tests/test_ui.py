"""The Dagster UI as its users see it, in a real browser (Debian's chromium, driven by
playwright): `clinical-sync dev` against a sandbox, the nightly job launched as the UI's
button launches it, then the asset graph, the claims table's checks and plots, and every
table's columns. Screenshots go to artefacts/ui/ (`make ui-test` installs what it needs)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import NoReturn

import pytest

from connectors.clinical_records.catalogue import BY_TABLE, DOCUMENTS, ENTITY_SETS
from pipelines.checks import MATCHES_SOURCE, RECONCILED, REFERENCES, REJECTS
from pipelines.definitions import defs
from pipelines.keys import ANALYTICS_GROUP, NIGHTLY_JOB, PUBLISHED_KEY, table_key
from pipelines.partitions import PARTITION_TAG
from tests.deployment import graphql, launch, wait_for_runs
from tests.dev_server import dev_server
from tests.warehouse_records import PER_BRANCH, project_copy
from warehouse.dbt_project import PROJECT_VARIABLE

pytestmark = [pytest.mark.ui, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("CLINICAL_CHROMIUM", "/usr/bin/chromium"))
ARTEFACTS = Path(os.environ.get("CLINICAL_UI_ARTEFACTS", ROOT / "artefacts" / "ui"))
LOCATION = "pipelines.definitions"
# How long a page may take to show what a step waits for: each wait ends when it shows. The
# UI draws an asset as "External Asset" until its code location's definitions arrive, which
# took over 5 s (playwright's default for `expect`) on a busy 2-core machine.
WAIT_MS = 60_000
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}  # one process per run: a short test


def run_job(url: str, job: str, timeout: float = 600.0, partition: str | None = None) -> str:
    """Launch `job` (of one tenant's partition) through the webserver's GraphQL API (what the
    Launch button sends) and wait for it to end; the daemon dequeues it."""
    tags = {PARTITION_TAG: partition} if partition is not None else None
    run_id = launch(url, LOCATION, job, IN_PROCESS, tags)
    status = wait_for_runs(url, [run_id], timeout)[run_id]
    assert status == "SUCCESS", f"run {run_id}: {status}"
    return run_id


def _unavailable(reason: str) -> NoReturn:
    """Skipped in a plain `pytest` without a browser; a failure under `make ui-test`."""
    if os.environ.get("CLINICAL_UI_REQUIRED"):
        pytest.fail(reason)
    pytest.skip(reason)


def visit(page, url: str) -> None:
    """Open `url` and wait until it has settled: its requests answered and nothing laid over
    it (a dialog's backdrop takes every click meant for the page)."""
    from playwright.sync_api import expect

    page.goto(url)
    page.wait_for_load_state("networkidle")
    expect(page.locator(".bp5-overlay-backdrop")).to_have_count(0)


@pytest.fixture
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        _unavailable("playwright is not installed (`make ui-test` installs it)")
    if not CHROMIUM.exists():
        _unavailable(f"no chromium at {CHROMIUM} (`make ui-test` installs Debian's)")
    sync_api.expect.set_options(timeout=WAIT_MS)  # every `expect`, as every page action
    with sync_api.sync_playwright() as playwright:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses root otherwise
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            yield launched
        finally:
            launched.close()


@pytest.mark.timeout(900)  # two nightly runs and 20 pages: 5 min on a busy 2-core machine
def test_the_ui_shows_every_asset_the_claims_checks_and_plots_and_each_tables_columns(
    browser, tmp_path
):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)  # a loaded machine draws a graph slowly
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    team = {PROJECT_VARIABLE: str(project_copy(tmp_path, claims_per_branch=PER_BRANCH))}
    with dev_server(tmp_path, extra=team) as server:
        # Dagster's community sign-up dialog would cover a new home's pages about a second
        # after they load (after `visit` looked): dagster.yaml turns it off
        assert graphql(server.url, "{ shouldShowNux }", {}) == {"shouldShowNux": False}
        for _ in range(2):  # two runs: each figure plots as a line
            run_job(server.url, NIGHTLY_JOB)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)

        by_group: dict[str, list[str]] = defaultdict(list)
        for spec in defs.resolve_all_asset_specs():
            by_group[spec.group_name].append(spec.key.path[-1])
        # The dbt models (transform/'s, the team's beside them) in the lineage after the tables.
        assert {"prescription_summary", "broken_references"} <= set(by_group[ANALYTICS_GROUP])
        by_group[ANALYTICS_GROUP].append("claims_per_branch")
        # The graph draws only what the viewport shows, and never zooms below a legible size:
        # the clinical group (11 tables and the models and links beside them) is 3,700 px tall.
        page.set_viewport_size({"width": 1600, "height": 4800})
        for group, names in sorted(by_group.items()):
            visit(page, server.url + f"/locations/{LOCATION}/asset-groups/{group}/lineage")
            for name in names:
                expect(page.locator("body")).to_contain_text(name)
            # one node per asset of the group (the other groups' assets are links, not nodes)
            expect(page.get_by_text("Latest event", exact=True)).to_have_count(len(names))
            page.screenshot(path=ARTEFACTS / f"graph-{group}.png")
        page.set_viewport_size({"width": 1600, "height": 1000})

        claims = BY_TABLE["claims"]
        visit(page, server.url + "/assets/clinical/claims?view=checks")
        graph = defs.resolve_asset_graph()
        checks = [k.name for k in graph.asset_check_keys if k.asset_key == table_key(claims)]
        assert sorted(checks) == sorted((MATCHES_SOURCE, REJECTS, RECONCILED, REFERENCES))
        for name in checks:
            expect(page.locator("body")).to_contain_text(name)
        page.screenshot(path=ARTEFACTS / "claims-checks.png", full_page=True)

        visit(page, server.url + "/assets/analytics/prescription_summary?view=checks")
        for name in ("primary_key_prescription_summary_prescription_id", "relationships_"):
            expect(page.locator("body")).to_contain_text(name)  # its dbt tests, as checks
        page.screenshot(path=ARTEFACTS / "model-checks.png", full_page=True)

        visit(page, server.url + "/assets/clinical/claims")
        page.get_by_text("Plots", exact=True).first.click()
        for figure in ("live_rows", "rows_fetched", "requests", "wait_seconds"):
            expect(page.get_by_text(figure, exact=True).first).to_be_visible()
        assert page.locator("canvas").count() >= 4
        page.get_by_text("live_rows", exact=True).first.scroll_into_view_if_needed()
        page.screenshot(path=ARTEFACTS / "claims-plots.png")

        for entity in [*ENTITY_SETS, DOCUMENTS]:
            visit(page, server.url + f"/assets/clinical/{entity.table}")
            columns = page.locator("body")
            expect(columns).to_contain_text("Columns")
            for field in entity.fields:
                expect(columns).to_contain_text(field.name)
                expect(columns).to_contain_text(field.meaning)
            page.screenshot(path=ARTEFACTS / f"columns-{entity.table}.png", full_page=True)


@pytest.mark.timeout(900)
def test_the_ui_shows_each_tenants_partition_and_its_last_run(browser, tmp_path):
    """With a tenants file: the published warehouse's partitions are the tenants, each
    materialized by its own last run into its own warehouse; the runs list each tenant's."""
    from playwright.sync_api import expect

    from cli.tenants import sandbox_tenants
    from tests.sandboxes import serving

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    names = ["clinic-a", "clinic-b"]
    with serving(names, scale=0.02) as sandbox:
        found = sandbox_tenants(sandbox, tmp_path / "tenants.toml")
        with dev_server(tmp_path, tenants_file=found.path) as server:
            last = {name: run_job(server.url, NIGHTLY_JOB, partition=name) for name in names}
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            published = "/assets/" + "/".join(PUBLISHED_KEY.path)
            visit(page, f"{server.url}{published}?view=partitions")
            body = page.locator("body")
            expect(body).to_contain_text(f"Materialized ({len(names)})")
            for name in names:
                expect(body).to_contain_text(name)
            page.screenshot(path=ARTEFACTS / "tenants-partitions.png", full_page=True)
            for name in names:  # the partition's latest materialization: its run, its file
                visit(page, f"{server.url}{published}?view=partitions&partition={name}")
                expect(body).to_contain_text("Latest materialization")
                expect(body).to_contain_text(last[name][:8])
                expect(body).to_contain_text(str(found.get(name).warehouse))
                page.screenshot(path=ARTEFACTS / f"tenant-{name}.png", full_page=True)
                visit(page, f"{server.url}/runs?q%5B0%5D=tag%3A{PARTITION_TAG}%3D{name}")
                expect(body).to_contain_text(f"partition: {name}")
                expect(body).to_contain_text(last[name][:8])
                expect(body).to_contain_text("Success")
                other = next(n for n in names if n != name)
                expect(body).not_to_contain_text(last[other][:8])
