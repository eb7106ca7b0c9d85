"""The rate limit a deployment shares through PostgreSQL (DAGSTER_POSTGRES_URL), against a
real server: processes on different "hosts" (their own folders, a clock off by minutes) stay
within one key's rate and burst as the service measures it; the SQLite bucket cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import pytest

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.ratelimit import (
    POSTGRES_TABLE,
    SAFETY,
    key_digest,
    postgres_limiter,
)
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.ratelimit import most_in_window
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import acquire_together
from tests.dev_server import free_port

API_KEY = "key-do-not-store-5522"
RATE, BURST = 8.0, 4
REQUESTS_PER_HOST = 28

# One "host": the connector in its own process, reading Branches one page at a time.
HOST = """
import sys, time
skew = float(sys.argv[1])
if skew:  # this host's clock is off: only a limiter on the database's clock is unmoved
    real = time.time
    time.time = lambda: real() + skew
from connectors.clinical_records.catalogue import BRANCHES
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.query import Query
from connectors.clinical_records.settings import Settings
with ClinicalClient(Settings.from_env(dotenv_path=None)) as client:
    for _ in range(int(sys.argv[2])):
        client.page(BRANCHES, Query(BRANCHES, top=1))
    print(client.stats.as_dict()["throttled"])
"""


def _hosts_at_once(server: SandboxServer, tmp_path: Path, shared: dict[str, str]) -> list[str]:
    """Two processes with the same key and nothing else in common (home, temporary folder,
    limiter file, clock); their outputs."""
    procs = []
    for n, skew in enumerate((0.0, 90.0)):
        host = tmp_path / f"host{n}"
        (host / "tmp").mkdir(parents=True)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))},
            **server.env(),
            "CLINICAL_RATE_LIMIT": str(RATE),
            "CLINICAL_BURST": str(BURST),
            "CLINICAL_LIMITER_PATH": str(host / "ratelimit.sqlite"),
            "CLINICAL_MAX_ATTEMPTS": "20",
            "HOME": str(host),
            "TMPDIR": str(host / "tmp"),
            **shared,
        }
        cmd = [sys.executable, "-c", HOST, str(skew), str(REQUESTS_PER_HOST)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=host, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        done = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for proc, (_, err) in zip(procs, done, strict=True):
        assert proc.returncode == 0, err[-2000:]
    return [out.strip() for out, _ in done]


def _worst_excess(arrivals: list[float]) -> float:
    """The most requests in any window beyond what rate and burst allow (<= 0: within)."""
    return max(most_in_window(arrivals, w) - (RATE * w + BURST) for w in (0.5, 1, 2, 4, 8))


@pytest.fixture
def limited_sandbox():
    config = SandboxConfig(seed=2, scale=0.01, rate=RATE, burst=BURST, api_key=API_KEY)
    with SandboxServer(config) as server:
        yield server


@pytest.mark.integration
def test_hosts_sharing_postgres_stay_within_the_keys_rate_and_burst(
    limited_sandbox, postgres_url, tmp_path
):
    outputs = _hosts_at_once(limited_sandbox, tmp_path, {"DAGSTER_POSTGRES_URL": postgres_url})
    arrivals = SandboxControl.from_env(limited_sandbox.env()).arrivals()
    assert len(arrivals) == 2 * REQUESTS_PER_HOST  # not one refused and sent again
    assert outputs == ["0", "0"]
    assert _worst_excess(arrivals) <= 0
    span = max(arrivals) - min(arrivals)
    assert span >= (2 * REQUESTS_PER_HOST - BURST) / RATE * 0.9  # the pair shared one rate
    connection = psycopg2.connect(postgres_url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT key, state FROM {POSTGRES_TABLE}")
            rows = cursor.fetchall()
    finally:
        connection.close()
    assert [key for key, _ in rows] == [key_digest(API_KEY)]  # named by a hash, never the key
    assert all(API_KEY not in state for _, state in rows)


@pytest.mark.integration
def test_hosts_with_their_own_sqlite_bucket_exceed_it(limited_sandbox, tmp_path):
    """Today's one-machine limiter on two hosts: each takes the whole rate and the service
    refuses what exceeds it (429s, which only then halve each host's pace): the failure the
    PostgreSQL bucket exists for."""
    outputs = _hosts_at_once(limited_sandbox, tmp_path, {})
    arrivals = SandboxControl.from_env(limited_sandbox.env()).arrivals()
    assert sum(int(n) for n in outputs) > 0
    assert len(arrivals) > 2 * REQUESTS_PER_HOST  # refused requests were sent again


def test_limiters_in_one_process_share_the_row(postgres_url):
    limiters = [postgres_limiter(postgres_url, API_KEY, 20.0, 3) for _ in range(2)]
    elapsed = acquire_together(limiters, 10)
    assert elapsed >= (20 - 2) / (20.0 * SAFETY) * 0.95  # burst - 1 at once, then the rate
    assert elapsed < 3.0
    hit = limiters[0]
    hit.throttled(0.5)  # a 429 seen by one pauses the other, through the row
    paused = time.monotonic()
    limiters[1].acquire()
    assert time.monotonic() - paused >= 0.45
    for limiter in limiters:
        limiter.close()


def test_an_unreachable_server_is_a_config_error_naming_the_variable():
    url = f"postgresql://clinical:pw@127.0.0.1:{free_port()}/dagster"
    with pytest.raises(ConfigError, match="DAGSTER_POSTGRES_URL") as raised:
        postgres_limiter(url, API_KEY, 2.0, 4)
    assert "pw" not in str(raised.value).replace("expected", "")
