"""The Dagster UI as its users see it, in a real browser (Debian's chromium, driven by
playwright): `clinical-sync dev` against a sandbox, the nightly job launched as the UI's
button launches it, then the asset graph, the claims table's checks and plots, and every
table's columns. Screenshots go to artefacts/ui/ (`make ui-test` installs what it needs)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import NoReturn

import pytest

from connectors.clinical_records.catalogue import BY_TABLE, DOCUMENTS, ENTITY_SETS
from pipelines.definitions import defs
from pipelines.keys import NIGHTLY_JOB, table_key
from tests.deployment import LAUNCH, STATUS, graphql
from tests.dev_server import dev_server

pytestmark = [pytest.mark.ui, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("CLINICAL_CHROMIUM", "/usr/bin/chromium"))
ARTEFACTS = Path(os.environ.get("CLINICAL_UI_ARTEFACTS", ROOT / "artefacts" / "ui"))
LOCATION, REPOSITORY = "pipelines.definitions", "__repository__"
WAIT_MS = 30_000


def run_job(url: str, job: str, timeout: float = 600.0) -> str:
    """Launch `job` through the webserver's GraphQL API (what the Launch button sends) and
    wait for it to end; the daemon dequeues it. In process, to keep the test short."""
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "jobName": job,
        },
        "runConfigData": {"execution": {"config": {"in_process": {}}}},
    }
    launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = graphql(url, STATUS, {"id": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            assert status == "SUCCESS", f"run {run_id}: {status}"
            return run_id
        time.sleep(1)
    raise AssertionError(f"run {run_id} did not end in {timeout:.0f} s")


def _unavailable(reason: str) -> NoReturn:
    """Skipped in a plain `pytest` without a browser; a failure under `make ui-test`."""
    if os.environ.get("CLINICAL_UI_REQUIRED"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        _unavailable("playwright is not installed (`make ui-test` installs it)")
    if not CHROMIUM.exists():
        _unavailable(f"no chromium at {CHROMIUM} (`make ui-test` installs Debian's)")
    with sync_api.sync_playwright() as playwright:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses root otherwise
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            yield launched
        finally:
            launched.close()


def test_the_ui_shows_every_asset_the_claims_checks_and_plots_and_each_tables_columns(
    browser, tmp_path
):
    from playwright.sync_api import expect

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with dev_server(tmp_path) as server:
        for _ in range(2):  # two runs: each figure plots as a line
            run_job(server.url, NIGHTLY_JOB)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)

        def visit(path: str) -> None:
            page.goto(server.url + path)
            page.wait_for_load_state("networkidle")
            skip = page.get_by_role("button", name="Skip")  # the community sign-up dialog
            if skip.count():
                skip.click()

        by_group: dict[str, list[str]] = defaultdict(list)
        for spec in defs.resolve_all_asset_specs():
            by_group[spec.group_name].append(spec.key.path[-1])
        page.set_viewport_size({"width": 1600, "height": 3200})  # the graph draws what is seen
        for group, names in sorted(by_group.items()):
            visit(f"/locations/{LOCATION}/asset-groups/{group}/lineage")
            for name in names:
                expect(page.locator("body")).to_contain_text(name)
            # one node per asset of the group (the other groups' assets are links, not nodes)
            expect(page.get_by_text("Latest event", exact=True)).to_have_count(len(names))
            page.screenshot(path=ARTEFACTS / f"graph-{group}.png")
        page.set_viewport_size({"width": 1600, "height": 1000})

        claims = BY_TABLE["claims"]
        visit("/assets/clinical/claims?view=checks")
        graph = defs.resolve_asset_graph()
        checks = [k.name for k in graph.asset_check_keys if k.asset_key == table_key(claims)]
        assert len(checks) >= 5
        for name in checks:
            expect(page.locator("body")).to_contain_text(name)
        page.screenshot(path=ARTEFACTS / "claims-checks.png", full_page=True)

        visit("/assets/clinical/claims")
        page.get_by_text("Plots", exact=True).first.click()
        for figure in ("live_rows", "rows_fetched", "requests", "wait_seconds"):
            expect(page.get_by_text(figure, exact=True).first).to_be_visible()
        assert page.locator("canvas").count() >= 4
        page.get_by_text("live_rows", exact=True).first.scroll_into_view_if_needed()
        page.screenshot(path=ARTEFACTS / "claims-plots.png")

        for entity in [*ENTITY_SETS, DOCUMENTS]:
            visit(f"/assets/clinical/{entity.table}")
            columns = page.locator("body")
            expect(columns).to_contain_text("Columns")
            for field in entity.fields:
                expect(columns).to_contain_text(field.name)
                expect(columns).to_contain_text(field.meaning)
            page.screenshot(path=ARTEFACTS / f"columns-{entity.table}.png", full_page=True)
