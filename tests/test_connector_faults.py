"""Self-healing over real HTTP: 429 bursts, injected 5xx, dropped connections, shared limit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import RetryExhausted
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import read_ids, settings_for, truth_ids

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


@pytest.mark.parametrize("retry_after_fraction", [1.0, 0.0], ids=["retry-after", "no-header"])
def test_429_bursts_are_waited_out(tmp_path: Path, retry_after_fraction: float) -> None:
    config = SandboxConfig(
        seed=4, scale=0.05, throttle_rate=0.3, retry_after_fraction=retry_after_fraction
    )
    with SandboxServer(config) as srv:
        started = time.monotonic()
        with ClinicalClient(settings_for(srv, tmp_path)) as client:
            ids = read_ids(client, cat.APPOINTMENTS) + read_ids(client, cat.PATIENTS)
            stats = client.stats.as_dict()
            lowered = client.limiter.current < client.limiter.configured
        elapsed = time.monotonic() - started
        expected = truth_ids(srv, cat.APPOINTMENTS) | truth_ids(srv, cat.PATIENTS)
        assert len(ids) == len(set(ids)) and set(ids) == expected
        server = srv.stats()
        assert stats["throttled"] == server["status_429_sent"] >= 1
        assert stats["retries"] == stats["throttled"]
        assert lowered  # the local rate came down after the 429s and recovers gradually
        if retry_after_fraction == 1.0:
            # the sandbox says Retry-After: 1 and the client waited it out
            assert stats["wait_seconds"] >= 1.0
        # wall-clock: overlapping waits of parallel requests count once
        assert stats["wait_seconds"] <= elapsed


def test_injected_5xx_and_dropped_connections_are_retried(tmp_path: Path) -> None:
    config = SandboxConfig(seed=6, scale=0.1, error_rate=0.05, drop_rate=0.05, fault_seed=3)
    with SandboxServer(config) as srv:
        with ClinicalClient(settings_for(srv, tmp_path)) as client:
            for entity in cat.ENTITY_SETS:
                ids = read_ids(client, entity)
                assert len(ids) == len(set(ids)), entity.name
                assert set(ids) == truth_ids(srv, entity), entity.name
            stats = client.stats.as_dict()
        server = srv.stats()
        faults = server.get("injected_error", 0) + server.get("injected_drop", 0)
        assert server.get("injected_drop", 0) >= 1 and server.get("injected_error", 0) >= 1
        assert stats["retries"] == faults
        assert stats["requests"] == server["requests"]


def test_a_persistent_failure_exhausts_a_bounded_budget(tmp_path: Path) -> None:
    with SandboxServer(SandboxConfig(seed=6, scale=0.05, error_rate=1.0)) as srv:
        settings = settings_for(srv, tmp_path, CLINICAL_MAX_ATTEMPTS="3")
        with ClinicalClient(settings) as client, pytest.raises(RetryExhausted) as caught:
            client.count(cat.PATIENTS)
        assert caught.value.attempts == 3 and caught.value.entity == "Patients"
        assert srv.stats()["requests"] == 3


CHILD = textwrap.dedent(
    """
    import json, os, sys
    from connectors.clinical_records import catalogue as cat
    from connectors.clinical_records.client import ClinicalClient
    from connectors.clinical_records.settings import Settings

    with ClinicalClient(Settings.from_env(dotenv_path=None)) as client:
        n = sum(len(p.records) for p in client.iter_pages(cat.entity(sys.argv[1])))
        print(json.dumps({"records": n, **client.stats.as_dict()}))
    """
)


def test_two_processes_share_one_limit_and_see_no_429(tmp_path: Path) -> None:
    """Both processes are configured at the sandbox's own limit; together they stay under it."""
    rate, burst = 6.0, 4
    with SandboxServer(SandboxConfig(seed=9, scale=0.1, rate=rate, burst=burst)) as srv:
        env = {
            **srv.env(),  # CLINICAL_RATE_LIMIT / CLINICAL_BURST = the sandbox's limit
            "CLINICAL_LIMITER_PATH": str(tmp_path / "shared.sqlite"),
            "PATH": "/usr/bin:/bin",
        }
        assert env["CLINICAL_RATE_LIMIT"] == "6" and env["CLINICAL_BURST"] == "4"
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, name],
                env=env,
                cwd=Path(__file__).resolve().parents[1],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("Appointments", "Claims")
        ]
        results = [child.communicate(timeout=120) for child in children]
        for child, (_, err) in zip(children, results, strict=True):
            assert child.returncode == 0, err[-2000:]
        figures = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
        server = srv.stats()
    assert [f["records"] for f in figures] == [
        len(srv.store.table("Appointments")),
        len(srv.store.table("Claims")),
    ]
    assert sum(f["requests"] for f in figures) == server["requests"] >= 12
    assert server.get("status_429_sent", 0) == 0
    assert sum(f["throttled"] for f in figures) == 0
