"""Case 4: two syncs at once on one warehouse; two extractions at once under one rate limit."""

from __future__ import annotations

import pytest

from connectors.clinical_records.catalogue import entity
from connectors.sandbox.server import SandboxServer
from tests.reliability.conftest import (
    Target,
    assert_lake_sound,
    assert_matches,
    compare,
    sandbox_config,
    truth,
)

pytestmark = pytest.mark.reliability

LOCKED_WORDS = ("locked", "one writer")
ONLY = ("Claims", "Patients", "Branches")


def test_two_syncs_on_one_warehouse_wait_or_refuse_and_corrupt_nothing(tmp_path, ledger):
    with SandboxServer(sandbox_config(seed=53, latency=0.005)) as server:
        target = Target(server, tmp_path / "target")
        target.root.mkdir(parents=True)
        source = truth(server)
        logs = [tmp_path / "first.log", tmp_path / "second.log"]
        # Three sets keep it short; the two runs still contend for every step and the file.
        procs = [target.start("sync", "--only", *ONLY, log=log) for log in logs]
        codes = [p.wait(timeout=300) for p in procs]
        texts = [log.read_text(errors="replace") for log in logs]
        for code, text in zip(codes, texts, strict=True):
            # Either it ran (perhaps after waiting its turn) or it refused, saying why.
            assert code == 0 or (code == 2 and any(w in text for w in LOCKED_WORDS)), text
            assert "Traceback" not in text, text
        assert 0 in codes, texts

        assert_matches(compare(target, source, entities=[entity(n) for n in ONLY]), ledger)
        assert_lake_sound(target)
        runs = target.query('SELECT "status", count(*) FROM "ops"."sync_runs" GROUP BY ALL')
        assert dict(runs).get("success", 0) == codes.count(0), runs


def test_parallel_extractions_stay_within_the_shared_rate_limit(tmp_path, ledger):
    rate, burst = 5, 4  # a plan of the spec's range (2 to 5 requests per second, a burst)
    config = sandbox_config(seed=59, scale=0.2, rate=rate, burst=burst)
    with SandboxServer(config) as server:
        limiter = tmp_path / "ratelimit.sqlite"  # one bucket file per machine and API key
        parts = (["Appointments"], ["Claims", "Prescriptions"])
        targets = []
        for n, only in enumerate(parts):
            target = Target(server, tmp_path / f"t{n}", rate=str(rate), burst=str(burst))
            target.extra_env["CLINICAL_LIMITER_PATH"] = str(limiter)
            target.root.mkdir(parents=True)
            targets.append((target, only))
        procs = [
            (t.start("sync", "--only", *only, log=t.root / "sync.log"), t, only)
            for t, only in targets
        ]
        for proc, target, _ in procs:
            assert proc.wait(timeout=300) == 0, (target.root / "sync.log").read_text()
        stats = server.control().stats()
        assert stats.get("status_429_sent", 0) == 0, stats
        requests = stats["requests"]
        assert requests > 4 * rate, stats  # seconds of sustained full rate
        for target, only in targets:
            assert_matches(compare(target, entities=[entity(n) for n in only]), ledger)
