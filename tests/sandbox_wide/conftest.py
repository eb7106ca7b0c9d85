"""A wide sandbox (seed 13, scale 0.2), served over HTTP once for this folder's tests (once per
worker), and every set read from it whole as a client pages it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.transport import path_key
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client
from tests.sandbox_wide.wide import (
    SCALE,
    keyset,
)


@pytest.fixture(scope="package")
def wide() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=13, scale=SCALE, values="wide")) as server:
        yield server


@pytest.fixture(scope="package")
def client(wide: SandboxServer) -> Iterator[httpx.Client]:
    with api_client(wide) as c:
        yield c


@pytest.fixture(scope="package")
def data(client: httpx.Client, wide: SandboxServer) -> dict[str, list[dict]]:
    """Every set as served, and every document of every patient that has one."""
    read = {e.name: keyset(client, e) for e in cat.ENTITY_SETS}
    owners = {d["patient_id"] for d in wide.store.ground_truth()[cat.DOCUMENTS.name]}
    read[cat.DOCUMENTS.name] = [
        d
        for patient in sorted(owners)
        for d in client.get(f"Patients({path_key(patient)})/Documents").json()["value"]
    ]
    return read
