"""The sandbox's synthetic data: deterministic, the sizes of issue 2, and awkward within the spec."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Edm
from connectors.sandbox import columns
from connectors.sandbox.store import Store

JSON_KIND = {
    Edm.STRING: str,
    Edm.INT32: int,
    Edm.DECIMAL: str,
    Edm.BOOLEAN: bool,
    Edm.DATE: str,
    Edm.DATETIME: str,
}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
DECIMAL = re.compile(r"-?\d+(\.\d+)?")


@pytest.fixture(scope="module")
def store() -> Store:
    return Store(seed=3, scale=1)


def test_same_seed_same_data_other_seed_other_data(store):
    again = Store(seed=3, scale=1)
    other = Store(seed=4, scale=1)
    assert again.ground_truth() == store.ground_truth()
    assert other.table("Patients").rows != store.table("Patients").rows


def test_scale_one_has_the_sizes_of_the_issue(store):
    counts = store.counts()
    assert counts["Patients"] == 2000
    assert counts["Appointments"] == 8000
    assert counts["Prescriptions"] == 2500
    assert counts["Claims"] == 3000
    assert counts["InsuranceVerifications"] == 2500
    small = Store(seed=3, scale=0.1).counts()
    assert small["Appointments"] == 800


@pytest.mark.parametrize("entity", cat.ENTITY_SETS, ids=lambda e: e.name)
def test_every_value_has_its_spec_type_and_length(store, entity):
    keys = set()
    for record in store.table(entity.name).rows:
        assert list(record) == [f.name for f in entity.fields]
        keys.add(record[entity.key])
        for fld in entity.fields:
            value = record[fld.name]
            if value is None:
                assert not fld.required, (fld.name, record)
                continue
            assert type(value) is JSON_KIND[fld.type], (fld.name, value)
            if fld.max_length:
                assert len(value) <= fld.max_length, (fld.name, value)
            pattern = {Edm.DATE: DATE, Edm.DATETIME: INSTANT, Edm.DECIMAL: DECIMAL}.get(fld.type)
            if pattern:
                assert pattern.fullmatch(value), (fld.name, value)
    assert len(keys) == len(store.table(entity.name).rows)


def test_awkward_values_are_present(store):
    patients = store.table("Patients").rows
    names = {p["last_name"] for p in patients} | {p["first_name"] for p in patients}
    assert any("'" in n for n in names if n)
    assert any(not n.isascii() for n in names if n)
    assert any(p["middle_name"] is None for p in patients)
    at_max = [
        f.name
        for e in cat.ENTITY_SETS
        for f in e.fields
        if f.max_length
        and any(len(r[f.name] or "") == f.max_length for r in store.table(e.name).rows)
    ]
    assert len(at_max) >= 10
    scales = {
        len(v.partition(".")[2])
        for r in store.table("InsuranceVerifications").rows
        for v in [r["deductible_amount"]]
        if v
    }
    assert scales >= {0, 1, 2, 3, 4}
    stamps = [a["updated_at"] for a in store.table("Appointments").rows]
    assert any(s.endswith("Z") for s in stamps) and any(
        re.search(r"[+-]\d\d:\d\d$", s) for s in stamps
    )
    assert any("." in s for s in stamps)
    assert Counter(stamps).most_common(1)[0][1] >= 200  # one bulk edit: hundreds share a time
    created = [p["created_at"] for p in store.table("Prescriptions").rows]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", c) for c in created)


def test_references_cross_the_string_and_number_types(store):
    patient_ids = {p["id"] for p in store.table("Patients").rows}
    assert all(isinstance(i, str) and i.isdigit() for i in patient_ids)
    appointments = store.table("Appointments").rows
    assert all(not a["id"].isdigit() for a in appointments)
    linked = [a for a in appointments if a["patient_id"] is not None]
    assert all(a["patient_id"] in patient_ids for a in linked)
    prescriptions = store.table("Prescriptions").rows
    assert all(
        type(p["patient_id"]) is int and str(p["patient_id"]) in patient_ids for p in prescriptions
    )


def test_about_one_percent_of_claims_point_at_a_missing_prescription(store):
    prescriptions = store.table("Prescriptions")
    claims = store.table("Claims").rows
    dangling = [c for c in claims if prescriptions.get(c["prescription_id"]) is None]
    assert 0.005 <= len(dangling) / len(claims) <= 0.02


def test_claim_amounts_add_up_exactly(store):
    from decimal import Decimal

    for claim in store.table("Claims").rows:
        total, paid, balance = (
            claim[k] for k in ("total_claim_amount", "total_claim_paid", "total_claim_balance")
        )
        if None not in (total, paid, balance):
            assert Decimal(total) == Decimal(paid) + Decimal(balance)


def test_advance_inserts_updates_and_deletes_after_the_old_clock():
    store = Store(seed=5, scale=0.2)
    before_clock = store.now
    before = {name: {r[t.entity.key]: r for r in t.rows} for name, t in store.tables.items()}
    summary = store.advance(
        seconds=86400, insert_fraction=0.05, update_fraction=0.05, delete_fraction=0.02
    )
    assert store.now > before_clock
    for name, table in store.tables.items():
        now = {r[table.entity.key]: r for r in table.rows}
        inserted = now.keys() - before[name].keys()
        deleted = before[name].keys() - now.keys()
        assert len(inserted) == summary[name]["inserted"]
        assert len(deleted) == summary[name]["deleted"]
        assert table.keys == sorted(table.keys)
        for key in inserted:
            created = now[key].get("created_at")
            if created and "T" in created:
                assert datetime.fromisoformat(created) > before_clock
        if "updated_at" in table.entity.by_name and name == "Appointments":
            changed = [k for k in now.keys() & before[name].keys() if now[k] != before[name][k]]
            assert len(changed) >= summary[name]["updated"] * 0.9
            assert all(datetime.fromisoformat(now[k]["updated_at"]) > before_clock for k in changed)
    assert summary["Appointments"]["inserted"] > 0


def test_days_made_with_the_stores_kept_keys_equal_days_made_from_its_rows(monkeypatch):
    """The store hands the generator each table's keys (`Table.keys`, kept beside its rows)
    so that a day's few records do not read every key off every record; the records made
    must be the ones the rows alone give, after inserts, updates and deletes."""

    def days(store: Store) -> dict:
        for _ in range(8):
            store.advance(
                seconds=86400, insert_fraction=0.01, update_fraction=0.01, delete_fraction=0.002
            )
            store.advance(seconds=60, insert_fraction=0.001, update_fraction=0.001)  # a few
        return store.ground_truth()

    kept = days(Store(seed=5, scale=0.3))
    monkeypatch.setattr(
        columns.Context,
        "keys_of",
        lambda ctx, home: [r[home.key] for r in ctx.made[home.name]],
    )
    assert days(Store(seed=5, scale=0.3)) == kept


def test_advance_changes_only_the_sets_it_is_given():
    """A day busy in one set (the simulation's busy Claims) leaves every other set as it was."""
    store = Store(seed=5, scale=0.2)
    before = {name: list(t.rows) for name, t in store.tables.items()}
    summary = store.advance(seconds=60, update_fraction=0.5, sets=("Claims",))
    assert set(summary) == {"Claims"} and summary["Claims"]["updated"] > 0
    for name, table in store.tables.items():
        assert (list(table.rows) == before[name]) is (name != "Claims")


def test_new_opaque_ids_land_inside_the_key_range():
    """Appointments ids are opaque strings: inserts do not only append (skip paging shifts)."""
    store = Store(seed=5, scale=0.2)
    last = store.table("Appointments").keys[-1]
    store.advance(seconds=3600, insert_fraction=0.05, update_fraction=0, delete_fraction=0)
    keys = store.table("Appointments").keys
    assert any(
        k < last
        for k in keys[:-1]
        if k not in Store(seed=5, scale=0.2).table("Appointments").by_key
    )


def test_drifts_log_keeps_the_newest_changes_only(monkeypatch):
    """A sandbox that drifts for days (`make dev`, a soak) keeps a bounded log of what drift
    changed: the newest CHANGES_KEPT, oldest first."""
    import random

    from connectors.sandbox import store as store_module

    monkeypatch.setattr(store_module, "CHANGES_KEPT", 6)
    small = Store(seed=5, scale=0.05)
    rng = random.Random(1)
    for _ in range(5):  # three changes each: a delete, an insert, an update
        small.drift(cat.APPOINTMENTS, rng=rng)
    assert len(small.changes) == 6
    assert [c.at for c in small.changes] == sorted(c.at for c in small.changes)
    assert small.changes[-1].at == small.now  # the newest kept
