"""`clinical-sync sandbox` serves a sandbox and prints settings a client can use as they are."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_sandbox_command_prints_working_env_lines():
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "sandbox",
            "--port",
            "0",
            "--scale",
            "0.02",
            "--rate",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        env = {}
        for line in process.stdout:
            if not line.strip():  # an empty line ends the settings
                break
            name, _, value = line.strip().partition("=")
            env[name] = value
        assert env["CLINICAL_RATE_LIMIT"] == "3" and env["CLINICAL_BURST"] == "10"
        token = httpx.post(
            f"{env['CLINICAL_AUTH_URL']}/oauth2/token",
            data={
                "grant_type": "client_credentials",
                "client_id": env["CLINICAL_CLIENT_ID"],
                "client_secret": env["CLINICAL_CLIENT_SECRET"],
                "scope": f"svc-customer-api/{env['CLINICAL_CUSTOMER']}",
            },
        ).json()["access_token"]
        response = httpx.get(
            f"{env['CLINICAL_API_BASE_URL']}/Branches",
            headers={"Authorization": f"Bearer {token}", "x-api-key": env["CLINICAL_API_KEY"]},
        )
        assert response.status_code == 200
        assert response.json()["value"]
    finally:
        process.terminate()
        process.wait(timeout=10)
    # The secrets go to stdout as env lines only, never to the log stream.
    with process.stdout, process.stderr:
        assert env["CLINICAL_CLIENT_SECRET"] not in process.stderr.read()


def _settings(*args: str) -> tuple[subprocess.Popen, dict[str, str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "sandbox", "--port", "0", "--scale", "0.02", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    env = {}
    for line in process.stdout:
        if not line.strip():
            break
        name, _, value = line.strip().partition("=")
        env[name] = value
    return process, env


def test_sandbox_command_limits_the_rate_as_the_spec_does_unless_told_not_to():
    """5 requests/s with a burst of 10 by default (the spec's top plan); `--rate 0`: none."""
    for args, limited in (((), True), (("--rate", "0"), False)):
        process, env = _settings(*args)
        try:
            token = httpx.post(
                f"{env['CLINICAL_AUTH_URL']}/oauth2/token",
                data={
                    "grant_type": "client_credentials",
                    "client_id": env["CLINICAL_CLIENT_ID"],
                    "client_secret": env["CLINICAL_CLIENT_SECRET"],
                    "scope": f"svc-customer-api/{env['CLINICAL_CUSTOMER']}",
                },
            ).json()["access_token"]
            headers = {"Authorization": f"Bearer {token}", "x-api-key": env["CLINICAL_API_KEY"]}
            with httpx.Client(headers=headers) as client:
                statuses = [
                    client.get(f"{env['CLINICAL_API_BASE_URL']}/Branches").status_code
                    for _ in range(25)
                ]
        finally:
            process.terminate()
            process.wait(timeout=10)
            process.stdout.close()
        if limited:
            assert env["CLINICAL_RATE_LIMIT"] == "5" and env["CLINICAL_BURST"] == "10"
            assert 429 in statuses
        else:
            assert "CLINICAL_RATE_LIMIT" not in env
            assert set(statuses) == {200}


def test_sandbox_command_sets_the_expansion_switches():
    """`--expand-cap` and `--refuse-document-expand` start the sandbox with them on."""
    process, env = _settings("--rate", "0", "--expand-cap", "1", "--refuse-document-expand")
    try:
        token = httpx.post(
            f"{env['CLINICAL_AUTH_URL']}/oauth2/token",
            data={
                "grant_type": "client_credentials",
                "client_id": env["CLINICAL_CLIENT_ID"],
                "client_secret": env["CLINICAL_CLIENT_SECRET"],
                "scope": f"svc-customer-api/{env['CLINICAL_CUSTOMER']}",
            },
        ).json()["access_token"]
        headers = {"Authorization": f"Bearer {token}", "x-api-key": env["CLINICAL_API_KEY"]}
        with httpx.Client(base_url=env["CLINICAL_API_BASE_URL"] + "/", headers=headers) as client:
            refused = client.get("Patients", params={"$expand": "Documents"})
            capped = client.get("Branches", params={"$expand": "Patients($count=true)"})
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "InvalidQueryOption"
    branches = capped.json()["value"]
    assert all(len(b["Patients"]) <= 1 for b in branches)
    assert any(b["Patients@odata.count"] > 1 for b in branches)
