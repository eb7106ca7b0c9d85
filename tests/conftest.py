"""Shared fixtures: a running sandbox on 127.0.0.1 and an authenticated HTTP client for it;
a lake and a warehouse under tmp_path; a real PostgreSQL server and a fresh database on it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from connectors.clinical_records.catalogue import SCOPE_PREFIX
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.postgres import INSTALL_HINT, PostgresServer, binaries, postgres_server
from tests.reliability.ledger import LEDGER, WORKER_OUTPUT
from tests.warehouse_records import Harness


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
