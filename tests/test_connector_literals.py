"""Property: any string survives the round trip through `$filter eq` to the sandbox."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.query import F, Query
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import settings_for

pytestmark = pytest.mark.integration

_serial = itertools.count(1)


@pytest.fixture(scope="module")
def planted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SandboxServer, ClinicalClient]]:
    with SandboxServer(SandboxConfig(seed=13, scale=0.05)) as srv:
        path = tmp_path_factory.mktemp("literals")
        with ClinicalClient(settings_for(srv, Path(path))) as client:
            yield srv, client


TRICKY = st.sampled_from(
    ["'", "''", "' or 1 eq 1 or '", "a&b=c", "50%", "x+y", "#", "\\", "é😀", " "]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.one_of(st.text(max_size=30), TRICKY))
def test_any_string_literal_round_trips(planted, value: str) -> None:
    srv, client = planted
    template = srv.store.table("Patients").rows[0]
    key = f"9{next(_serial):08d}"
    with srv.store.lock:
        srv.store.plant(cat.PATIENTS, {**template, "id": key, "first_name": value})
    query = Query(cat.PATIENTS, filter=F("first_name") == value, select=["first_name"])
    found = [r for page in client.iter_pages(cat.PATIENTS, query) for r in page.records]
    assert key in {r["id"] for r in found}
    assert all(r["first_name"] == value for r in found)
    assert client.count(cat.PATIENTS, F("first_name") == value) == len(found)
