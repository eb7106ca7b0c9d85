"""`clinical-sync sandbox` serves a sandbox and prints settings a client can use as they are."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from connectors.sandbox.control import SandboxControl

pytestmark = pytest.mark.integration


@contextmanager
def served(*args: str, log: list[str] | None = None) -> Iterator[tuple[dict, dict]]:
    """`clinical-sync sandbox ARGS` at a small scale: the settings it printed (env lines up
    to an empty line) and a client's headers; what it logged is added to `log`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "sandbox", "--port", "0", "--scale", "0.02", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        env = {}
        for line in process.stdout:
            if not line.strip():
                break
            name, _, value = line.strip().partition("=")
            env[name] = value
        token = httpx.post(
            f"{env['CLINICAL_AUTH_URL']}/oauth2/token",
            data={
                "grant_type": "client_credentials",
                "client_id": env["CLINICAL_CLIENT_ID"],
                "client_secret": env["CLINICAL_CLIENT_SECRET"],
                "scope": f"svc-customer-api/{env['CLINICAL_CUSTOMER']}",
            },
        ).json()["access_token"]
        yield env, {"Authorization": f"Bearer {token}", "x-api-key": env["CLINICAL_API_KEY"]}
    finally:
        process.terminate()
        process.wait(timeout=10)
        with process.stdout, process.stderr:
            (log if log is not None else []).append(process.stderr.read())


def test_sandbox_command_prints_working_env_lines():
    log: list[str] = []
    with served("--rate", "3", log=log) as (env, headers):
        assert env["CLINICAL_RATE_LIMIT"] == "3" and env["CLINICAL_BURST"] == "10"
        response = httpx.get(f"{env['CLINICAL_API_BASE_URL']}/Branches", headers=headers)
        assert response.status_code == 200
        assert response.json()["value"]
    # The secrets go to stdout as env lines only, never to the log stream.
    assert log and env["CLINICAL_CLIENT_SECRET"] not in log[0]


def test_sandbox_command_limits_the_rate_as_the_spec_does_unless_told_not_to():
    """5 requests/s with a burst of 10 by default (the spec's top plan); `--rate 0`: none."""
    for args, limited in (((), True), (("--rate", "0"), False)):
        with served(*args) as (env, headers), httpx.Client(headers=headers) as client:
            statuses = [
                client.get(f"{env['CLINICAL_API_BASE_URL']}/Branches").status_code
                for _ in range(25)
            ]
        if limited:
            assert env["CLINICAL_RATE_LIMIT"] == "5" and env["CLINICAL_BURST"] == "10"
            assert 429 in statuses
        else:
            assert "CLINICAL_RATE_LIMIT" not in env
            assert set(statuses) == {200}


def test_sandbox_command_sets_the_expansion_switches():
    """`--expand-cap` and `--refuse-document-expand` start the sandbox with them on."""
    switches = ("--rate", "0", "--expand-cap", "1", "--refuse-document-expand")
    with served(*switches) as (env, headers):
        base = env["CLINICAL_API_BASE_URL"] + "/"
        with httpx.Client(base_url=base, headers=headers) as client:
            refused = client.get("Patients", params={"$expand": "Documents"})
            capped = client.get("Branches", params={"$expand": "Patients($count=true)"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "InvalidQueryOption"
    branches = capped.json()["value"]
    assert all(len(b["Patients"]) <= 1 for b in branches)
    assert any(b["Patients@odata.count"] > 1 for b in branches)


def test_sandbox_command_seeds_where_drift_strikes():
    """`--drift-seed` picks which records drift changes: the same seed, the same changes."""

    def changed(seed: str) -> list[tuple]:
        args = ("--rate", "0", "--drift-every", "1", "--drift-seed", seed)
        with served(*args) as (env, headers), httpx.Client(headers=headers) as client:
            for _ in range(3):
                client.get(f"{env['CLINICAL_API_BASE_URL']}/Patients").raise_for_status()
            changes = SandboxControl.from_env(env).changes()
        return [(c["kind"], c["key"]) for c in changes]

    first = changed("1")
    assert len(first) == 9  # three requests, each a delete, an insert and an update
    assert changed("1") == first and changed("2") != first
