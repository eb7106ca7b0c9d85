"""A record never read and a record read then deleted cancel in every count: reconciliation
finds both only when told how many records no read brought (children of a parent deleted
before its page), by halving key ranges that agree. Over HTTP against a sandbox."""

from __future__ import annotations

import pytest

from connectors.clinical_records.catalogue import INSURANCE_VERIFICATIONS
from connectors.clinical_records.client import ClinicalClient
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
        reconciler = Reconciler(ENTITY, client, take=lambda records: None, held=held)
        result = reconciler.finish()
    assert result.exact and result.requests == 1  # one probe: the count agrees
    assert missing not in reconciler.held and deleted in reconciler.held


def test_records_expected_from_earlier_counts_are_searched_for_where_counts_agree(moved, tmp_path):
    server, held, missing, deleted = moved
    taken: list[dict] = []
    with ClinicalClient(settings_for(server, tmp_path)) as client:
        reconciler = Reconciler(ENTITY, client, take=taken.extend, held=held)
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
        reconciler = Reconciler(ENTITY, client, take=lambda records: None, held=held)
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
        reconciler = Reconciler(ENTITY, client, take=lambda records: None, held=keys)
        result = reconciler.finish()
    assert len(keys) > 300
    assert (result.inserted, result.deleted, result.requests) == (1, 1, 1), result
    assert reconciler.deleted_keys() == [str(keys[-50])] and keys[-1] + 1000 in reconciler.held
