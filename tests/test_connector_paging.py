"""Paging over real HTTP: every record once, in key order, under token expiry and drift."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import AuthenticationError, BadRequest, NotFound
from connectors.clinical_records.query import Expand, F, Query, Raw
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import read_ids, settings_for, truth_ids

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> SandboxServer:
    with SandboxServer(SandboxConfig(seed=21, scale=0.1)) as srv:
        yield srv


@pytest.fixture
def client(server: SandboxServer, tmp_path: Path) -> ClinicalClient:
    with ClinicalClient(settings_for(server, tmp_path)) as c:
        yield c


def test_every_set_read_completely_once(server: SandboxServer, client: ClinicalClient) -> None:
    for entity in cat.ENTITY_SETS:
        ids = read_ids(client, entity)
        assert len(ids) == len(set(ids)), entity.name
        assert set(ids) == truth_ids(server, entity), entity.name
    stats = client.stats.as_dict()
    assert stats["records"] == sum(len(truth_ids(server, e)) for e in cat.ENTITY_SETS)
    assert stats["pages"] >= len(cat.ENTITY_SETS)
    assert stats["throttled"] == stats["retries"] == 0


def test_windows_overlap_by_one_and_come_in_key_order(
    server: SandboxServer, client: ClinicalClient
) -> None:
    progress: list[tuple[str, int, int]] = []
    pages = list(client.iter_pages(cat.APPOINTMENTS, progress=lambda *args: progress.append(args)))
    total = len(truth_ids(server, cat.APPOINTMENTS))
    assert {p.total for p in pages} == {total}
    assert [p.number for p in pages] == list(range(len(pages)))
    keys = [r["id"] for p in pages for r in p.records]
    assert keys == sorted(keys)  # the sandbox orders string keys by code point
    # 100 on the first page, then 99 new records per overlapping window
    assert [len(p.records) for p in pages[:-1]] == [100] + [99] * (len(pages) - 2)
    assert client.stats.requests == 1 + -(-(total - 100) // 99)
    assert progress[-1] == ("Appointments", len(pages), len(pages))


def test_a_reader_that_takes_from_a_record_still_gets_each_record_once(
    server: SandboxServer, client: ClinicalClient
) -> None:
    """A family's read takes each parent's expanded children off the record as the page
    arrives; the next window's overlap (the same parent, as sent) must still be known as
    the one already passed on. Before: it was passed on twice, and its children's count
    with it, so two claims without a parent went unmissed (simulation seed 1173)."""
    query = Query(cat.PRESCRIPTIONS, expand=[Expand("Claims", count=True)])
    seen: list[int] = []
    for page in client.iter_pages(cat.PRESCRIPTIONS, query):
        for record in page.records:
            record.pop("Claims", None)  # as sync/packed.py's _unpack does
            record.pop("Claims@odata.count", None)
            seen.append(record["id"])
    assert len(server.store.table("Prescriptions").rows) > 100  # more than one window
    assert sorted(seen) == sorted(r["id"] for r in server.store.table("Prescriptions").rows)


def test_filter_select_and_expand_pass_through(
    server: SandboxServer, client: ClinicalClient
) -> None:
    query = Query(
        cat.PRESCRIPTIONS,
        filter=F("active") == True,  # noqa: E712
        select=["patient_id"],
        expand=["Claims"],
    )
    records = [r for p in client.iter_pages(cat.PRESCRIPTIONS, query) for r in p.records]
    truth = [r for r in server.store.table("Prescriptions").rows if r["active"] is True]
    assert [r["id"] for r in records] == [r["id"] for r in truth]
    assert set(records[0]) == {"id", "patient_id", "Claims"}
    assert client.count(cat.PRESCRIPTIONS, F("active") == True) == len(truth)  # noqa: E712


def test_typed_errors_carry_the_service_error(client: ClinicalClient) -> None:
    with pytest.raises(BadRequest) as bad:
        client.page(cat.PATIENTS, Query(cat.PATIENTS, filter=Raw("first_name eq")))
    assert bad.value.status == 400 and bad.value.code == "InvalidFilter"
    assert bad.value.message and bad.value.details and bad.value.entity == "Patients"
    with pytest.raises(NotFound) as missing:
        client.get(cat.BRANCHES, 987654)
    assert (missing.value.status, missing.value.code) == (404, "NotFound")
    assert client.stats.retries == 0  # 4xx are never retried
    assert client.get(cat.BRANCHES, 1)["id"] == 1


def test_token_lifetime_two_seconds_during_a_paging_run(tmp_path: Path) -> None:
    config = SandboxConfig(seed=3, scale=0.125, token_lifetime=2.0, rate=4, burst=2)
    with SandboxServer(config) as srv:
        with ClinicalClient(settings_for(srv, tmp_path)) as client:
            started = time.monotonic()
            ids = read_ids(client, cat.APPOINTMENTS)
            elapsed = time.monotonic() - started
            refreshes = client.stats.token_refreshes
        assert len(ids) == len(set(ids)) == len(truth_ids(srv, cat.APPOINTMENTS)) >= 1000
        assert elapsed > 2.0
        assert refreshes >= 2 and refreshes == srv.stats()["tokens_issued"]
        # one refresh per 80% of the lifetime however many requests were in flight
        assert refreshes <= elapsed / 1.6 + 1
        assert srv.stats().get("status_401", 0) == 0  # renewed before expiry, not after


def test_a_401_costs_one_refresh_and_one_retry(server: SandboxServer, tmp_path: Path) -> None:
    with ClinicalClient(settings_for(server, tmp_path)) as client:
        client.get(cat.BRANCHES, 1)
        before = server.stats().get("status_401", 0)
        with server.store.lock:
            server.sandbox.tokens._expiry.clear()  # the service forgets every token
        assert client.get(cat.BRANCHES, 2)["id"] == 2
        assert server.stats().get("status_401", 0) == before + 1
        assert client.stats.token_refreshes == 2


def test_drift_during_paging_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """Under change, "equal" means: no id twice; every id that existed for the whole read is
    read; every id read existed at its start or end. Drift inserts and updates a record every
    few requests (Appointment ids are random, so inserts land between windows); a second
    thread hard-deletes records that existed at the start."""
    config = SandboxConfig(seed=8, scale=0.15, drift_every=3, rate=20, burst=5, latency=0.05)
    with SandboxServer(config) as srv:
        before = truth_ids(srv, cat.APPOINTMENTS)
        victims = sorted(before)[::23]
        done = threading.Event()

        def delete_some() -> None:
            """Four records at a time: a window shifted by two or more would leave a gap."""
            for start in range(0, len(victims), 4):
                if done.wait(0.1):
                    return
                with srv.store.lock:
                    for key in victims[start : start + 4]:
                        srv.store.table("Appointments").delete(key)

        deleter = threading.Thread(target=delete_some)
        deleter.start()
        with ClinicalClient(settings_for(srv, tmp_path, CLINICAL_MAX_IN_FLIGHT="4")) as client:
            ids = read_ids(client, cat.APPOINTMENTS)
            repairs = client.stats.gap_repairs
        done.set()
        deleter.join()
        after = truth_ids(srv, cat.APPOINTMENTS)
        assert srv.stats().get("injected_drift", 0) >= 3
        assert after - before and before - after  # the source did change under the read
        assert len(ids) == len(set(ids))
        assert before & after <= set(ids)
        assert set(ids) <= before | after
        assert repairs >= 1  # a window did not join up and its gap was re-read by keyset


def test_invalid_scope_says_what_is_probably_wrong(server: SandboxServer, tmp_path: Path) -> None:
    before = server.stats()["token_requests"]
    settings = settings_for(server, tmp_path, CLINICAL_CUSTOMER="someone-else")
    with ClinicalClient(settings) as client, pytest.raises(AuthenticationError) as refused:
        client.count(cat.PATIENTS)
    assert refused.value.code == "invalid_scope"
    assert "CLINICAL_CUSTOMER" in str(refused.value)
    assert server.stats()["token_requests"] == before + 1  # not retried
