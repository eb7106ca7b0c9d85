"""Case 5: a warehouse remembers the service and customer it was built from and refuses to
load another one unless the operator says `--force`: before any step starts and before any
request to the other service, exit status 2 and one message (issue 42)."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from connectors.clinical_records.catalogue import entity
from connectors.sandbox.server import SandboxServer
from tests.reliability.conftest import Target, assert_matches, compare, sandbox_config

pytestmark = pytest.mark.reliability

ONLY = ("Branches", "Claims")


def held(target: Target) -> dict[str, object]:
    """What a refused run must leave untouched: rows, source, runs and lake files."""
    return {
        "rows": target.query('SELECT count(*), max("_synced_at") FROM "clinical"."claims"'),
        "source": target.query('SELECT "base_url", "customer" FROM "ops"."source"'),
        "runs": target.query('SELECT count(*) FROM "ops"."sync_runs"'),
        "files": sorted(str(p) for p in target.lake.rglob("*.parquet")),
        "lake_source": (target.lake / "_source.json").read_text(),
    }


def two_sources() -> tuple[SandboxServer, SandboxServer]:
    return (
        SandboxServer(sandbox_config(seed=61)),
        SandboxServer(sandbox_config(seed=62, customer="other-clinic")),
    )


def test_another_source_is_refused_without_force(tmp_path):
    first, second = two_sources()
    with first, second:
        built = Target(first, tmp_path)
        built.sync("--only", *ONLY)
        before = held(built)

        intruder = Target(second, tmp_path)  # the same WAREHOUSE_PATH, LAKE_ROOT, home
        with DagsterInstance.from_config(str(built.dagster_home)) as instance:
            runs_before = len(instance.get_runs())
        for args in (("--only", *ONLY), ()):  # a few sets, and the whole nightly
            refused = intruder.run("sync", *args)
            said = refused.stdout + refused.stderr
            assert refused.returncode == 2, said  # nothing ran
            assert said.strip().count("\n") == 0, said  # one message
            assert "other-clinic" in said and "another source" in said, said
            assert held(built) == before  # not a row, file or run of the other source
        with DagsterInstance.from_config(str(built.dagster_home)) as instance:
            assert len(instance.get_runs()) == runs_before  # no run, so no step started
        stats = second.stats()
        assert stats.get("requests", 0) == stats.get("token_requests", 0) == 0, stats


def test_force_adopts_the_new_source(tmp_path, ledger):
    first, second = two_sources()
    with first, second:
        Target(first, tmp_path).sync("--only", "Branches")
        adopted = Target(second, tmp_path)
        adopted.sync("--force", "--only", "Branches")
        assert adopted.query('SELECT "base_url", "customer" FROM "ops"."source"') == [
            (second.base_url, "other-clinic")
        ]
        assert_matches(compare(adopted, entities=[entity("Branches")]), ledger)
