"""A record never read and a record read then deleted cancel in every count: reconciliation
finds both only when told how many records no read brought (children of a parent deleted
before its page), by halving key ranges that agree. Over HTTP against a sandbox."""

from __future__ import annotations

import math

import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENTS,
    INSURANCE_VERIFICATIONS,
    PATIENTS,
    PHYSICIANS,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.keys import key_text
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from sync.reconcile import Reconciler
from tests.connector_helpers import read_ids, settings_for

ENTITY = INSURANCE_VERIFICATIONS


@pytest.fixture
def moved(tmp_path):
    """A sandbox, every key of a set as read, then one of them deleted at the source: the
    held keys less one never read (`missing`), with one gone (`deleted`)."""
    with SandboxServer(SandboxConfig(seed=3, scale=0.5)) as server:
        with ClinicalClient(settings_for(server, tmp_path)) as client:
            keys = sorted(read_ids(client, ENTITY))
        missing, deleted = keys[len(keys) // 5], keys[4 * len(keys) // 5]
        server.store.tables[ENTITY.name].delete(deleted)
        yield server, set(keys) - {missing}, missing, deleted


def test_a_count_that_agrees_hides_a_missing_record_and_a_deleted_one(moved, tmp_path):
    server, held, missing, deleted = moved
    with ClinicalClient(settings_for(server, tmp_path)) as client:
        reconciler = Reconciler(ENTITY, client, to_batch=lambda records: None, held=held)
        result = reconciler.finish()
    assert result.exact and result.requests == 1  # one probe: the count agrees
    assert missing not in reconciler.held and deleted in reconciler.held


def test_records_expected_from_earlier_counts_are_searched_for_where_counts_agree(moved, tmp_path):
    server, held, missing, deleted = moved
    taken: list[dict] = []
    with ClinicalClient(settings_for(server, tmp_path)) as client:
        reconciler = Reconciler(ENTITY, client, to_batch=taken.extend, held=held)
        result = reconciler.finish(expected_new=1)
    assert missing in reconciler.held and missing in {r[ENTITY.key] for r in taken}
    assert reconciler.deleted_keys() == [str(deleted)]
    assert (result.inserted, result.deleted, result.unconfirmed) == (1, 1, 0)
    assert result.requests < 40, result  # far below reading the set again


@pytest.mark.parametrize(("scale", "reads_it_all"), [(0.5, True), (5, False)])
def test_what_the_search_cannot_find_is_reported(tmp_path, scale, reads_it_all):
    """Nothing is missing: a set that costs no more to read than the search is read (then
    nothing is in doubt); a larger one spends the search's bounded cost, then says how many
    it could not find instead of reading on."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=scale)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        held = set(read_ids(client, ENTITY))
        reconciler = Reconciler(ENTITY, client, to_batch=lambda records: None, held=held)
        result = reconciler.finish(expected_new=2)
    pages = -(-len(held) // 100)
    assert result.residual == 0 and result.inserted == 0 and result.deleted == 0
    if reads_it_all:
        assert result.exact and result.requests == 2 + pages, (result, pages)  # 2 probes, 1 read
    else:
        assert not result.exact and result.unconfirmed == result.unreconciled == 2
        assert result.requests < pages // 2, (result, pages)


def test_the_probe_settles_the_highest_keys_of_a_set_without_a_cursor(tmp_path):
    """A set without a change cursor probes its highest keys: an insert after the last key
    read (where a service numbers new records) and a delete among the hundred highest cost
    no request beyond the probe, though they cancel in the count."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=0.5)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        keys = sorted(read_ids(client, ENTITY))
        table = server.store.tables[ENTITY.name]
        table.delete(keys[-50])
        server.store.plant(ENTITY, {**table.get(keys[0]), ENTITY.key: keys[-1] + 1000})
        reconciler = Reconciler(ENTITY, client, to_batch=lambda records: None, held=keys)
        result = reconciler.finish()
    assert len(keys) > 300
    assert (result.inserted, result.deleted, result.requests) == (1, 1, 1), result
    assert reconciler.deleted_keys() == [str(keys[-50])] and keys[-1] + 1000 in reconciler.held


def test_a_range_of_two_pages_costs_one_request_when_its_first_page_holds_the_difference(
    tmp_path,
):
    """The request that counts a range brings its first page too: a delete among a
    two-page range's lowest hundred keys is settled by that one request, not by reading
    both pages."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=1)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        keys = sorted(read_ids(client, PHYSICIANS))
        server.store.tables[PHYSICIANS.name].delete(keys[10])
        reconciler = Reconciler(PHYSICIANS, client, to_batch=lambda records: None, held=keys)
        result = reconciler.finish()
    assert 100 < len(keys) <= 200 and PHYSICIANS.change_cursor is None
    assert reconciler.deleted_keys() == [str(keys[10])]
    assert (result.ranges, result.requests) == (1, 3), result  # probe, the range, probe


def test_children_of_a_parent_deleted_before_its_page_are_found_together(tmp_path):
    """Children that no parent's page brought share their parent's reference: one search
    over ranges of the reference finds them all, where halving key ranges would search
    for each apart."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=1)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        records = [r for page in client.iter_pages(APPOINTMENTS) for r in page.records]
        by_parent: dict[str, list] = {}
        for record in records:
            by_parent.setdefault(record["patient_id"], []).append(record["id"])
        parent = max((p for p in by_parent if p is not None), key=lambda p: len(by_parent[p]))
        orphans = set(by_parent[parent])
        held = [r for r in records if r["id"] not in orphans]
        refs = sorted(r["patient_id"] for r in held if r["patient_id"] is not None)
        reconciler = Reconciler(
            APPOINTMENTS, client, to_batch=lambda records: None, held=[r["id"] for r in held]
        )
        parents = {key_text(p) for p in by_parent} - {key_text(parent)}
        found = reconciler.find_children("patient_id", refs, len(orphans), parents)
    pages = -(-len(records) // 100)
    assert len(orphans) >= 3 and pages > 50
    assert {r["id"] for r in found} == orphans
    assert reconciler.result.inserted == len(orphans)
    assert reconciler.result.requests <= 2 + math.ceil(math.log2(pages)), reconciler.result


@pytest.fixture
def patients(tmp_path):
    """A sandbox and every patient as read (`Patients` has a partition: Branches)."""
    with (
        SandboxServer(SandboxConfig(seed=3, scale=1)) as server,
        ClinicalClient(settings_for(server, tmp_path)) as client,
    ):
        records = [r for page in client.iter_pages(PATIENTS) for r in page.records]
        yield server, client, records


def test_a_set_a_small_set_navigates_to_is_searched_per_parent(patients):
    """One request counts the patients per branch (`Branches?$expand=Patients($count=true;
    $top=0)`): a delete is then searched for among its branch's patients only."""
    server, client, records = patients
    gone = next(r for r in records[len(records) // 3 :] if r["primary_branch_id"] is not None)
    server.store.tables[PATIENTS.name].delete(gone["id"])
    reconciler = Reconciler(PATIENTS, client, to_batch=lambda records: None)
    reconciler.read(records)
    result = reconciler.finish()
    pages = -(-len(records) // 100)
    assert reconciler.deleted_keys() == [gone["id"]] and result.exact
    assert pages >= 20 and result.requests <= 5, result  # probe, cells, range, by key, probe


def test_a_record_that_moved_to_another_parent_unseen_is_not_taken_for_deleted(patients):
    """Patients have no `updated_at`: a patient moved to another branch during the read
    leaves one cell and joins another. Next to a delete, which makes the counts differ,
    the moved patient stays held and comes back as it is now."""
    server, client, records = patients
    branches = sorted({r["primary_branch_id"] for r in records} - {None})
    moved = next(r for r in records if r["primary_branch_id"] == branches[0])
    gone = next(r for r in records if r["primary_branch_id"] == branches[-1])
    table = server.store.tables[PATIENTS.name]
    table.delete(gone["id"])
    server.store.plant(PATIENTS, {**moved, "primary_branch_id": branches[1]})
    taken: list[dict] = []
    reconciler = Reconciler(PATIENTS, client, to_batch=taken.extend)
    reconciler.read(records)
    result = reconciler.finish()
    assert reconciler.deleted_keys() == [gone["id"]] and result.exact
    assert moved["id"] in reconciler.held
    assert {r["primary_branch_id"] for r in taken if r["id"] == moved["id"]} == {branches[1]}


def test_a_record_that_moved_into_a_cell_whose_count_agrees_is_not_lost(patients):
    """A patient moved unseen into a branch where another was deleted: that branch's count
    agrees, so only the branch it left is searched, where it is missing. It is asked for
    by key before it counts as deleted; the next round then finds the delete."""
    server, client, records = patients
    branches = sorted({r["primary_branch_id"] for r in records} - {None})
    moved = next(r for r in records if r["primary_branch_id"] == branches[0])
    gone = next(r for r in records if r["primary_branch_id"] == branches[1])
    server.store.tables[PATIENTS.name].delete(gone["id"])
    server.store.plant(PATIENTS, {**moved, "primary_branch_id": branches[1]})
    reconciler = Reconciler(PATIENTS, client, to_batch=lambda records: None)
    reconciler.read(records)
    result = reconciler.finish()
    assert moved["id"] in reconciler.held and moved["id"] not in reconciler.deleted_keys()
    assert reconciler.deleted_keys() == [gone["id"]] and result.exact
