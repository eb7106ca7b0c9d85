"""The sandbox's wide values profile end to end (issue 29): every field drawn from its spec
type, not from the catalogue's choices. A full sync, a day of changes and the nightly run,
and a rebuild from the lake each end with every record sent held once, every value as sent
(tests/as_sent.py, written from the spec: strings byte for byte, decimals exactly, the same
instants), nothing rejected, and the analytics views linking the pairs the references name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance

from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.runner import sync
from tests.as_sent import differences, linked_pairs, sent_pairs
from tests.truth import sent
from warehouse.rebuild import rebuild

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wide() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=29, scale=0.08, values="wide")) as server:
        yield server


def env_for(server: SandboxServer, root: Path) -> dict[str, str]:
    return {
        **server.env(),
        "CLINICAL_RATE_LIMIT": "200",
        "CLINICAL_BURST": "50",
        "CLINICAL_LIMITER_PATH": str(root / "ratelimit.sqlite"),
    }


def assert_as_sent(warehouse: Path, server: SandboxServer) -> None:
    records = sent(server)
    problems = differences(warehouse, records)
    assert not problems, f"{len(problems)} differences, the first:\n" + "\n".join(problems[:15])
    with duckdb.connect(str(warehouse), read_only=True) as con:
        kinds = dict(
            con.execute('SELECT "kind", count(*) FROM "ops"."rejects" GROUP BY ALL').fetchall()
        )
    assert kinds.get("reject", 0) == 0, kinds
    links, wanted = linked_pairs(warehouse), sent_pairs(records)
    for name, pairs in wanted.items():
        assert links[name] == pairs, (name, sorted(pairs ^ links[name], key=str)[:5])
    assert wanted["claims"] and wanted["verifications"]  # the pairs are there to compare


def test_every_value_the_spec_allows_is_held_as_sent_through_a_night_and_a_rebuild(wide, tmp_path):
    paths = {"lake_root": str(tmp_path / "lake"), "warehouse_path": str(tmp_path / "wh.duckdb")}
    env = env_for(wide, tmp_path)
    with DagsterInstance.ephemeral() as instance:
        full = sync(env, instance=instance, log_level="WARNING", **paths)
        assert full.success, full.failure
        assert_as_sent(Path(paths["warehouse_path"]), wide)

        changed = wide.control().advance(
            seconds=86400,
            insert_fraction=0.02,
            update_fraction=0.02,
            delete_fraction=0.01,
            document_fraction=0.02,
        )
        assert sum(c["inserted"] + c["updated"] + c["deleted"] for c in changed.values()) > 0
        nightly = sync(env, instance=instance, log_level="WARNING", **paths)
        assert nightly.success, nightly.failure
        assert nightly.entities["Claims"]["mode"] == "incremental"
        assert_as_sent(Path(paths["warehouse_path"]), wide)

    rebuilt = tmp_path / "rebuilt.duckdb"
    rebuild(paths["lake_root"], rebuilt)
    assert_as_sent(rebuilt, wide)
