"""Case 4: two syncs at once on one warehouse; two extractions at once under one rate limit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from connectors.clinical_records.catalogue import ALL_ENTITIES, entity
from connectors.sandbox.server import SandboxServer
from sync.phase import PHASE_FILE, Phase
from tests.reliability.conftest import (
    SYNC_TIMEOUT,
    Target,
    assert_lake_sound,
    assert_matches,
    compare,
    sandbox_config,
    truth,
)
from tests.reliability.test_crashes import phase_target
from warehouse.lake import Lake

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


def test_a_rebuild_started_while_a_sync_loads_waits_and_loses_nothing(tmp_path, ledger):
    """`clinical-sync rebuild` started while a sync loads (issue 42): the rebuild waits for
    the sync's writer lock, naming it, or is refused (exit 2) naming it; afterwards the
    warehouse equals the source and holds every batch the lake holds, each loaded once."""
    with SandboxServer(sandbox_config(seed=55, scale=0.1, latency=0.005)) as server:
        target = phase_target(server, tmp_path / "target")
        target.sync("--only", "Branches")  # a lake and a warehouse to rebuild
        source = truth(server)
        marker = Path(target.env()[PHASE_FILE])
        marker.unlink(missing_ok=True)
        sync = target.start("sync", log=tmp_path / "sync.log")
        deadline = time.monotonic() + SYNC_TIMEOUT
        while not (marker.exists() and marker.read_text().startswith(Phase.LOAD)):
            assert sync.poll() is None, (tmp_path / "sync.log").read_text()
            assert time.monotonic() < deadline, "the sync never loaded"
            time.sleep(0.01)
        rebuilt = target.run("rebuild")
        assert sync.wait(timeout=SYNC_TIMEOUT) == 0, (tmp_path / "sync.log").read_text()
        said = rebuilt.stdout + rebuilt.stderr
        assert rebuilt.returncode in (0, 2), said
        assert "being written by" in said and "sync" in said, said  # the holder named
        assert "Traceback" not in said, said

        assert_matches(compare(target, source), ledger)
        assert_lake_sound(target)
        lake = Lake(target.lake)
        held = {Lake.info(p).batch_id for e in ALL_ENTITIES for p in lake.files(e)}
        loaded = {b for (b,) in target.query('SELECT "batch_id" FROM "ops"."loaded_batches"')}
        assert loaded == held  # no committed load lost
