"""Every check result is recorded as it was printed (issue 42): a WARN of the reference checks,
evaluated in their own step after the loads, reaches ops.set_results, analytics.sync_health
and `status --json`'s `warned_checks` like the load's own checks, in the copy the run
published."""

from __future__ import annotations

import json
import re

import duckdb
import pytest

from connectors.clinical_records.catalogue import BY_TABLE
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.test_pipelines_cli import env_for, run

pytestmark = pytest.mark.integration

PRINTED = re.compile(r"^\s+(WARN|ERROR)\s+(\w+)\.(\w+):", re.MULTILINE)


def test_every_check_printed_is_in_status_json_and_sync_health(tmp_path):
    # Every riding child set's reference dangles for a share of its records: claims,
    # verifications and appointments warn references_found.
    with SandboxServer(SandboxConfig(seed=12, scale=0.05, dangling=0.05)) as server:
        env = env_for(server, tmp_path)
        done = run(["sync"], env, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        printed: dict[str, set[str]] = {}
        for severity, table, check in PRINTED.findall(done.stdout):
            printed.setdefault(BY_TABLE[table].name, set()).add(f"{severity} {check}")
        warned = {
            name: {c[5:] for c in found if c.startswith("WARN")} for name, found in printed.items()
        }
        assert any("references_found" in checks for checks in warned.values()), done.stdout

        shown = run(["status", "--json"], env, tmp_path)
        assert shown.returncode == 0, shown.stderr
        sets = {s["entity"]: s for s in json.loads(shown.stdout)["entity_sets"]}
        for name, checks in warned.items():
            assert set(sets[name]["warned_checks"]) == checks, name
        for name, entry in sets.items():
            if name not in warned:
                assert entry["warned_checks"] == [], name

        with duckdb.connect(env["WAREHOUSE_PATH"], read_only=True) as con:
            health = dict(
                con.execute("SELECT entity, warned_checks FROM analytics.sync_health").fetchall()
            )
            recorded = dict(
                con.execute('SELECT "entity", "warned_checks" FROM "ops"."set_results"').fetchall()
            )
        for name, checks in warned.items():
            assert set(health[name]) == checks == set(recorded[name]), name
