"""A run's last look at a set comes after every other request to it (issue 29): what the
source wrote while the reconciliation's own reads were in flight is seen, and a cursor
that does not order in time is not trusted as one. Over HTTP against a sandbox, under 5%
server errors and 4 s tokens, several requests in flight."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from connectors.clinical_records.catalogue import CLAIMS, PRESCRIPTIONS, EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from sync.reconcile import Reconciler
from tests.connector_helpers import settings_for

FAULTS = {"error_rate": 0.05, "token_lifetime": 4}


@pytest.fixture
def a_day_of_claims() -> Iterator[SandboxServer]:
    """Claims of which several pages were written today: `updated_at` is a date, so they
    all share the newest value, and no one answer of a hundred shows every write since."""
    with SandboxServer(SandboxConfig(seed=11, scale=0.5, **FAULTS)) as server:
        server.store.advance(
            seconds=3600, insert_fraction=0, update_fraction=0.3, delete_fraction=0
        )
        yield server


def read_all(reconciler: Reconciler, client: ClinicalClient, taken: list[dict]) -> None:
    """The extraction's own read, as `sync.extract` does it."""
    reconciler.begin()
    for page in client.iter_pages(reconciler.entity):
        taken.extend(page.records)
        reconciler.read(page.records)


def latest(entity: EntitySet, taken: list[dict]) -> dict[object, dict]:
    """Per key, the version taken last: the one the load keeps (same cursor: the later row)."""
    return {record[entity.key]: record for record in taken}


def test_a_change_while_the_catch_up_is_in_flight_is_seen(a_day_of_claims, tmp_path):
    """The trace of issue 29: Claims read, then the probe, then a read of `updated_at ge
    <mark>` over five pages. While its fourth page is asked (its first page and count
    answered), the source inserts a claim whose key sorts below every key and moves another
    claim's date to today. The probe and the window's count after that read see both."""
    server = a_day_of_claims
    table = server.store.table(CLAIMS.name)
    taken: list[dict] = []
    with ClinicalClient(settings_for(server, tmp_path)) as client:
        reconciler = Reconciler(CLAIMS, client, to_batch=taken.extend)
        read_all(reconciler, client, taken)
        today = server.store.now.date().isoformat()
        # Written after its page was read: today's claims must be read again.
        server.store.plant(CLAIMS, {**table.rows[-1], "updated_at": today, "uncollected": "1.5"})
        served = len(server.sandbox.served)
        script = [{"entity": "Claims", "request": 5, "inserts": 1, "updates": 1, "place": "before"}]
        server.configure(drift_script=script)
        result = reconciler.finish()
    inserted, updated = (change.key for change in server.store.changes)
    after = [options for name, options in list(server.sandbox.served)[served:] if name == "Claims"]
    window = ["updated_at ge" in o.get("$filter", "") for o in after]
    assert all(window[1:5]), "the change did not land on the window's fourth page"
    held = latest(CLAIMS, taken)
    assert inserted < min(k for k in table.keys if k != inserted) and inserted in reconciler.held
    for key in (inserted, updated, table.keys[-1]):
        assert held[key] == table.get(key), key
    assert result.exact and result.caught_up >= 3, result
    assert any(o["$orderby"].startswith("updated_at desc") for o in after[5:]), "no probe after"
    assert "$skip" not in after[-1] and after[-1]["$count"] == "true", "the last look is a page"


def test_a_text_without_a_format_is_no_change_cursor(tmp_path):
    """Prescriptions.created_at is a string the spec gives no format: the service orders it
    as text, and an offset-less value cannot be placed in time. A prescription inserted
    during the run with such a value (an hour before the newest, were it UTC) and a delete
    cancel in the count; the set is probed by its highest keys instead, where the
    service numbers new records, and both are found."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=0.5, **FAULTS)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        table = server.store.table(PRESCRIPTIONS.name)
        taken: list[dict] = []
        reconciler = Reconciler(PRESCRIPTIONS, client, to_batch=taken.extend)
        read_all(reconciler, client, taken)
        new, gone = table.keys[-1] + 1, table.keys[len(table) // 2]
        newest = max(datetime.fromisoformat(r["created_at"]) for r in table.rows)
        local = (newest - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")  # UTC-5, say
        server.store.plant(PRESCRIPTIONS, {**table.rows[0], "id": new, "created_at": local})
        table.delete(gone)
        result = reconciler.finish()
    assert new in reconciler.held and new in latest(PRESCRIPTIONS, taken)
    assert reconciler.deleted_keys() == [str(gone)] and result.exact
    assert PRESCRIPTIONS.change_cursor is None
