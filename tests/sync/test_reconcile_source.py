"""The client's `Source` counts the requests reconciliation sends, and only those: the
client is shared with the read and the other sets. Over HTTP against a sandbox."""

from __future__ import annotations

from connectors.clinical_records.catalogue import PAGE_SIZE, PHYSICIANS
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.query import Query
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from sync.reconcile_source import ClientSource
from tests.connector_helpers import settings_for


def test_the_client_source_counts_its_own_requests_alone(tmp_path):
    with (
        SandboxServer(SandboxConfig(seed=5, scale=0.5)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        source = ClientSource(client, PHYSICIANS)
        first = Query(PHYSICIANS, orderby=[("id", False)], top=PAGE_SIZE, count=True)
        envelope = client.page(PHYSICIANS, first)  # the read's, not reconciliation's
        assert source.requests == 0
        assert source.page(first) == envelope and source.requests == 1
        known = envelope["value"][0]["id"]
        assert source.by_key([known, "no-such-physician"])[1] is None
        assert source.requests == 1 + 2
