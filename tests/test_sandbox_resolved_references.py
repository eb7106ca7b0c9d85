"""The sandbox switch under which every reference resolves (issue 20): over real HTTP, every
field a catalogue navigation joins on is set and names a record the service serves, from the
start and after a day of changes and drift; with the switch off the data is today's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.sandbox import columns, generator
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client
from tests.test_sandbox_cli import served

pytestmark = pytest.mark.integration


@pytest.fixture
def server() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(seed=5, scale=0.1, resolved_references=True)) as server:
        yield server


def read_all(client: httpx.Client, name: str) -> list[dict]:
    """Every record of a set, page by page, as a client reads them."""
    rows: list[dict] = []
    while True:
        params = {"$orderby": "id", "$top": "100", "$skip": str(len(rows))}
        page = client.get(name, params=params)
        assert page.status_code == 200
        rows += page.json()["value"]
        if len(page.json()["value"]) < 100:
            return rows


def unresolved(client: httpx.Client) -> list[tuple[str, str, object]]:
    """(set, field, value) of every navigation reference that is null or names no record."""
    sets = {e.name: read_all(client, e.name) for e in cat.ENTITY_SETS}
    keys = {name: {str(r["id"]) for r in rows} for name, rows in sets.items()}
    bad = [
        (child, field, row.get(field))
        for child, field, parent in sorted(columns.RESOLVED)
        for row in sets[child]
        if row.get(field) is None or str(row[field]) not in keys[parent]
    ]
    for patient_id in sorted(keys[cat.PATIENTS.name])[:40]:  # documents name their patient
        listing = client.get(f"Patients({patient_id})/Documents").json()["value"]
        bad += [("Documents", "patient_id", d) for d in listing if d["patient_id"] != patient_id]
    return bad


def test_the_fields_that_must_resolve_are_the_navigations_joins() -> None:
    assert {
        ("Appointments", "patient_id", "Patients"),
        ("Appointments", "prescription_id", "Prescriptions"),
        ("Claims", "prescription_id", "Prescriptions"),
        ("InsuranceVerifications", "prescription_id", "Prescriptions"),
        ("Prescriptions", "patient_id", "Patients"),
    } <= columns.RESOLVED


def test_default_data_has_nulls_and_dangling_claims(fresh_sandbox: SandboxServer) -> None:
    """Off (the default) the sandbox keeps what the spec allows and the planner must cover."""
    with api_client(fresh_sandbox) as client:
        bad = unresolved(client)
    assert {(s, f) for s, f, v in bad if v is None} >= {("Appointments", "patient_id")}
    assert any(s == "Claims" and v is not None for s, _, v in bad)  # dangling


def test_every_reference_resolves_then_and_after_changes(server: SandboxServer) -> None:
    with api_client(server) as client:
        assert unresolved(client) == []
        control = server.control()
        control.advance(seconds=86400, insert_fraction=0.05, delete_fraction=0.05)
        assert unresolved(client) == []
        server.configure(drift_every=1, drift_inserts=2, drift_deletes=2, drift_updates=2)
        for entity in cat.ENTITY_SETS:  # every set drifts while it is read
            read_all(client, entity.name)
        server.configure(drift_every=0)
        assert {c["entity"] for c in control.changes()} >= {e.name for e in cat.ENTITY_SETS}
        assert unresolved(client) == []


def test_the_same_seed_gives_the_same_data_apart_from_references() -> None:
    """The switch changes references only: every other field is the default data's."""
    plain = generator.generate(5, 0.1)
    resolved = generator.generate(5, 0.1, resolved=True)
    for entity in cat.ENTITY_SETS:
        assert [r["id"] for r in plain[entity.name]] == [r["id"] for r in resolved[entity.name]]
        others = [
            f.name for f in entity.fields if (entity.name, f.name) not in columns.RESOLVED_FIELDS
        ]
        for a, b in zip(plain[entity.name], resolved[entity.name], strict=True):
            assert {k: a[k] for k in others} == {k: b[k] for k in others}


def test_sandbox_command_takes_the_switch() -> None:
    with served("--rate", "0", "--resolved-references") as (env, headers):
        base = env["CLINICAL_API_BASE_URL"] + "/"
        with httpx.Client(base_url=base, headers=headers) as client:
            assert unresolved(client) == []


def dangling_of(made: dict[str, list[dict]]) -> dict[str, list]:
    """Per riding child set, the keys of its records whose parent reference names no record."""
    out = {}
    for name, (parent, nav) in cat.RIDES_WITH.items():
        if name in made:
            parents = {str(r[parent.key]) for r in made[parent.name]}
            out[name] = [
                r["id"]
                for r in made[name]
                if r[nav.remote] is not None and str(r[nav.remote]) not in parents
            ]
    return out


def test_a_dangling_share_of_every_child_set_spread_through_its_keys() -> None:
    """`dangling` (benchmarks/expansion_cost.py's profile) over resolved data: that share of
    each riding child set names a missing parent, through its keys; nothing else changes."""
    resolved = generator.generate(5, 1, resolved=True)
    made = generator.generate(5, 1, resolved=True, dangling=0.01)
    for name, keys in dangling_of(made).items():
        rows = made[name]
        assert len(keys) == round(len(rows) * 0.01) > 0, name
        ordered = [r["id"] for r in rows]
        assert (
            ordered.index(keys[0]) < len(rows) // 4 < len(rows) * 3 // 4 < ordered.index(keys[-1])
        ), name  # spread, not bunched at one end
        changed = {r["id"] for r, s in zip(resolved[name], rows, strict=True) if r != s}
        assert changed == set(keys)
    assert all(not keys for keys in dangling_of(resolved).values())


@pytest.mark.parametrize("share", ["-0.1", "1", "x"])
def test_sandbox_command_refuses_a_bad_dangling_share(share: str) -> None:
    from cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["sandbox", "--dangling", share])


def test_sandbox_command_takes_the_dangling_share_and_the_or_switch() -> None:
    with served(
        "--rate", "0", "--resolved-references", "--dangling", "0.05", "--refuse-filter-or"
    ) as (
        env,
        headers,
    ):
        base = env["CLINICAL_API_BASE_URL"] + "/"
        with httpx.Client(base_url=base, headers=headers) as client:
            assert {s for s, _, _ in unresolved(client)} >= {"Claims", "InsuranceVerifications"}
            refused = client.get("Claims", params={"$filter": "id eq 1 or id eq 2"})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "InvalidFilter"


FINGERPRINT = """
import hashlib, json
from connectors.sandbox.store import Store
store = Store(seed=5, scale=0.1, resolved_references=True)
for _ in range(3):
    store.advance(seconds=3600, insert_fraction=0.01, update_fraction=0.01, delete_fraction=0.002)
truth = json.dumps(store.ground_truth(), sort_keys=True, default=str)
print(hashlib.sha256(truth.encode()).hexdigest())
"""


def test_resolved_data_is_the_seeds_whatever_pythons_hash_seed():
    """Same seed, same data, in any process: the references a new record is made to name are
    drawn in one order, not in the order a set of names happens to iterate (it varies with
    PYTHONHASHSEED, and the data did with it)."""
    prints = {
        subprocess.run(
            [sys.executable, "-c", FINGERPRINT],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(prints) == 1, prints
