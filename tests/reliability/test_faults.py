"""Case 1: a flaky, throttling, drifting server with short-lived tokens; nothing lost."""

from __future__ import annotations

import pytest

from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.sandbox.server import SandboxServer
from tests.reliability.conftest import (
    Target,
    assert_matches,
    canonical,
    compare,
    live,
    sandbox_config,
    truth,
)

pytestmark = pytest.mark.reliability

FAULTS = {
    "error_rate": 0.05,  # 500, 502 and 503 alike
    "drop_rate": 0.02,
    "latency": 0.004,
    "jitter": 0.004,
    "token_lifetime": 3,  # a token dies mid-run, several times
    "throttle_rate": 0.05,
    "retry_after_fraction": 0.5,  # half the 429s say when to come back, half do not
}
DRIFT_EVERY = 4  # the source changes every few pages


def stable_records(before: dict[str, list[dict]], after: dict[str, list[dict]]):
    """Per set, the records identical before and after a run: paging may not lose these."""
    out = {}
    for entity in ENTITY_SETS:
        old = {r[entity.key]: r for r in before[entity.name]}
        out[entity.name] = [r for r in after[entity.name] if old.get(r[entity.key]) == r]
    return out


def test_full_then_incremental_sync_under_faults_equal_the_source(tmp_path, ledger):
    with SandboxServer(sandbox_config(seed=41, scale=0.15, fault_seed=3)) as server:
        target = Target(server, tmp_path)
        server.control().faults(**FAULTS, drift_every=DRIFT_EVERY)

        # 1. A full sync while the source drifts: every record that stayed put is held.
        before = truth(server)
        target.sync_in_process(full=True)
        after = truth(server)
        held = 0
        for entity in ENTITY_SETS:
            have = live(target, entity)
            for key, record in canonical(
                entity, stable_records(before, after)[entity.name]
            ).items():
                assert have.get(key) == record, f"{entity.name} {key!r} lost or stale in paging"
                held += 1
        assert held > 0.8 * sum(len(after[e.name]) for e in ENTITY_SETS)

        # 2. A day of changes, then an incremental sync under the same faults, no drift.
        server.control().faults(drift_every=0)
        changes = server.control().advance(
            seconds=86400, insert_fraction=0.02, update_fraction=0.02, delete_fraction=0.01
        )
        assert sum(c["deleted"] for c in changes.values()) > 0
        report = target.sync_in_process()
        assert report.entities["Appointments"]["mode"] == "incremental"
        # Snapshot sets equal the source with deletes marked; cursor sets hold every current
        # record; created-only sets every new one (docs/ARCHITECTURE.md, Incremental sync).
        assert_matches(compare(target, exact=False), ledger)

        stats = server.control().stats()
        ledger.add_faults(stats)
        injected = {k: v for k, v in stats.items() if k.startswith("injected_")}
        assert injected.get("injected_error", 0) > 0, stats
        assert injected.get("injected_drift", 0) > 0, stats
        assert stats["tokens_issued"] > 1, "a 3 s token must have been refreshed"
