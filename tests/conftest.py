"""Shared fixtures: a running sandbox on 127.0.0.1 and an authenticated HTTP client for it;
a lake and a warehouse under tmp_path; a real PostgreSQL server and a fresh database on it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENT_TYPES,
    APPOINTMENTS,
    BRANCHES,
    CLAIMS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PHYSICIANS,
    PRESCRIPTIONS,
    SCOPE_PREFIX,
)
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.postgres import INSTALL_HINT, PostgresServer, binaries, postgres_server
from tests.reliability.ledger import LEDGER, WORKER_OUTPUT
from tests.warehouse_records import MODELS, Harness, record
from warehouse import models


def fetch_token(server: SandboxServer, customer: str | None = None) -> str:
    """A token for `customer`'s client (default: the sandbox's first customer)."""
    env = server.env(customer)
    response = httpx.post(
        f"{server.auth_url}/oauth2/token",
        data={
            "grant_type": "client_credentials",
            "client_id": env["CLINICAL_CLIENT_ID"],
            "client_secret": env["CLINICAL_CLIENT_SECRET"],
            "scope": f"{SCOPE_PREFIX}{env['CLINICAL_CUSTOMER']}",
        },
    )
    response.raise_for_status()
    return response.json()["access_token"]


def api_client(server: SandboxServer, customer: str | None = None) -> httpx.Client:
    """An httpx client of `customer` (default: the first) that sends the spec's headers;
    paths are relative to {base_url}."""
    return httpx.Client(
        base_url=server.base_url + "/",
        headers={
            "Authorization": f"Bearer {fetch_token(server, customer)}",
            "x-api-key": server.env(customer)["CLINICAL_API_KEY"],
            "Accept": "application/json",
        },
        timeout=30,
    )


@pytest.fixture(scope="session")
def sandbox() -> Iterator[SandboxServer]:
    """A read-only sandbox shared by the tests that do not change it."""
    with SandboxServer(SandboxConfig(seed=11, scale=0.2)) as server:
        yield server


@pytest.fixture(scope="session")
def api(sandbox: SandboxServer) -> Iterator[httpx.Client]:
    with api_client(sandbox) as client:
        yield client


@pytest.fixture
def fresh_sandbox() -> Iterator[SandboxServer]:
    """A small sandbox of its own, for tests that mutate data or inject faults."""
    with SandboxServer(SandboxConfig(seed=5, scale=0.05)) as server:
        yield server


@pytest.fixture
def harness(tmp_path) -> Iterator[Harness]:
    """A lake and a warehouse under tmp_path (tests/warehouse_records.py); a test module may
    define its own."""
    h = Harness(tmp_path)
    yield h
    h.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/postgres.py). In CI (CI set) a machine
    without PostgreSQL fails these tests: they never skip there."""
    if binaries() is None:
        if os.environ.get("CI"):
            pytest.fail(f"{INSTALL_HINT} (CI runs the PostgreSQL tests; .ci/run installs it)")
        pytest.skip(INSTALL_HINT)
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres.database()


# -- the reliability suite's ledger, here because the controller of `pytest -n` collects no
# test and so loads no conftest below this one


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A worker of `pytest -n` ended: its reliability figures added to the session's."""
    LEDGER.add(getattr(node, "workeroutput", {}).get(WORKER_OUTPUT, {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if getattr(config, "workeroutput", None) is None:  # a worker's is sent, not printed
        LEDGER.print_to(terminalreporter)


@pytest.fixture
def linked(tmp_path) -> Iterator[Harness]:
    """A warehouse with the linked records of every model, its models built (their tests' files
    share it)."""
    h = Harness(tmp_path)
    h.sync(PATIENTS, [record(PATIENTS, 10, id="10", first_name="Zoë", last_name="O'Brien")])
    h.sync(BRANCHES, [record(BRANCHES, 3, name="North")])
    h.sync(
        PHYSICIANS,
        [
            record(PHYSICIANS, 21, id="21", first_name="Ada", last_name="Ref"),
            record(PHYSICIANS, 22, id="22", first_name="Bo", last_name="Care"),
        ],
    )
    h.sync(APPOINTMENT_TYPES, [record(APPOINTMENT_TYPES, 1)])
    h.sync(
        PRESCRIPTIONS,
        [
            record(
                PRESCRIPTIONS,
                100,
                patient_id=10,
                branch_id=3,
                referring_physician_id=21,
                primary_care_physician_id=22,
                prescription_date="2026-01-01",
                delivered_on="2026-01-11T15:00:00-05:00",
            ),
            record(PRESCRIPTIONS, 101, patient_id=10, delivered_on=None),
        ],
    )
    claim = {
        "total_claim_amount": "0.10",
        "total_claim_paid": "0.05",
        "prescription_id": 100,
        "billing_branch_id": 3,
    }
    staying = [
        record(CLAIMS, 1, **claim, date_of_service="2026-01-20"),
        record(CLAIMS, 2, **{**claim, "total_claim_amount": "0.20"}, date_of_service="2026-01-15"),
        record(CLAIMS, 3, prescription_id=999, billing_branch_id=3),
    ]
    h.sync(
        CLAIMS,
        [*staying, record(CLAIMS, 4, **{**claim, "total_claim_amount": "5.00"})],
        snapshot=True,
    )
    h.sync(
        CLAIMS, staying, day=1, snapshot=True
    )  # claim 4 deleted at the source: a snapshot without it
    h.sync(
        INSURANCE_VERIFICATIONS,
        [
            record(
                INSURANCE_VERIFICATIONS,
                7,
                prescription_id=100,
                verified_on="2026-01-02",
                network_type="OUT",
            ),
            record(
                INSURANCE_VERIFICATIONS,
                8,
                prescription_id=100,
                verified_on="2026-01-05",
                network_type="IN",
                pre_auth_necessary=True,
            ),
            record(INSURANCE_VERIFICATIONS, 9, prescription_id=555),
        ],
    )
    h.sync(
        APPOINTMENTS,
        [
            record(
                APPOINTMENTS, 1, patient_id="10", prescription_id="100", appointment_type_id="app-1"
            ),
            record(
                APPOINTMENTS,
                2,
                patient_id="404",
                prescription_id="100",
                appointment_type_id="app-1",
            ),
        ],
    )
    assert set(models.build(h.path).built) == MODELS
    yield h
    h.close()
