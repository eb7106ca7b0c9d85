"""The sandbox's rate limit, injected faults, drift and test controls, over real HTTP on
127.0.0.1 (spec section 8, and what the sandbox adds for tests)."""

from __future__ import annotations

import time
from datetime import datetime

import httpx
import pytest

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client
from tests.test_sandbox_http import error_of

pytestmark = pytest.mark.integration


# -- section 8: the rate limit ------------------------------------------------------------


def test_rate_limit_answers_429_with_retry_after():
    with SandboxServer(SandboxConfig(scale=0.02, rate=2, burst=2)) as server:
        with api_client(server) as client:
            statuses = [client.get("Branches", params={"$top": "1"}) for _ in range(6)]
        limited = [r for r in statuses if r.status_code == 429]
        assert limited, [r.status_code for r in statuses]
        assert statuses[0].status_code == statuses[1].status_code == 200
        assert int(limited[0].headers["retry-after"]) >= 1
        assert error_of(limited[0])["code"] == "TooManyRequests"
        time.sleep(1.1)
        with api_client(server) as client:
            assert client.get("Branches").status_code == 200


def test_limits_and_token_lifetime_change_at_runtime_and_back():
    """benchmarks/expansion_cost.py lifts the limit and lengthens tokens for dlt's run through
    the control, then puts ours back: each setting must take effect, and only for tokens
    issued after it."""
    config = SandboxConfig(scale=0.02, rate=2, burst=2, token_lifetime=0.5)
    with SandboxServer(config) as server:
        control = server.control()
        short = api_client(server)  # a token issued under the 0.5 s lifetime
        assert control.faults(rate=None, token_lifetime=60) == {"rate": None, "token_lifetime": 60}
        with api_client(server) as client:
            assert {client.get("Branches").status_code for _ in range(8)} == {200}
            time.sleep(0.7)
            assert client.get("Branches").status_code == 200  # issued at 60 s: alive
            with short:
                assert short.get("Branches").status_code == 401  # kept its own expiry

        control.faults(rate=2, burst=2, token_lifetime=0.5)
        time.sleep(1.1)  # the bucket refills to the burst
        with api_client(server) as client:
            statuses = [client.get("Branches").status_code for _ in range(6)]
            assert statuses[:2] == [200, 200] and 429 in statuses
            time.sleep(1.1)
            response = client.get("Branches")
        assert response.status_code == 401
        assert "expired" in error_of(response)["details"]


# -- faults -------------------------------------------------------------------------------


def test_injected_server_errors_use_the_error_body(fresh_sandbox):
    fresh_sandbox.configure(error_rate=1.0)
    with api_client(fresh_sandbox) as client:
        response = client.get("Branches")
    assert response.status_code in (500, 502, 503)
    assert error_of(response)["code"]


def test_injected_drop_kills_the_connection(fresh_sandbox):
    fresh_sandbox.configure(drop_rate=1.0)
    with api_client(fresh_sandbox) as client, pytest.raises(httpx.TransportError):
        client.get("Branches")


def test_injected_throttle_with_and_without_retry_after(fresh_sandbox):
    fresh_sandbox.configure(throttle_rate=1.0, retry_after_fraction=0.0)
    with api_client(fresh_sandbox) as client:
        response = client.get("Branches")
        assert response.status_code == 429
        assert "retry-after" not in response.headers
        fresh_sandbox.configure(retry_after_fraction=1.0)
        assert "retry-after" in client.get("Branches").headers


def test_injected_garble_is_a_200_a_client_cannot_parse(fresh_sandbox):
    fresh_sandbox.configure(garble_rate=1.0)
    with api_client(fresh_sandbox) as client:
        for _ in range(6):
            response = client.get("Branches")
            assert response.status_code == 200
            with pytest.raises(ValueError):
                response.json()
    assert fresh_sandbox.stats()["injected_garble"] == 6


def test_latency_is_added(fresh_sandbox):
    fresh_sandbox.configure(latency=0.3)
    with api_client(fresh_sandbox) as client:
        started = time.monotonic()
        client.get("Branches")
        assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize("name", ["Claims", "Patients", "Appointments"])
def test_drift_is_the_worst_the_spec_allows(fresh_sandbox, name):
    """Drift changes the set being read: deletes, inserts before, between and after its
    keys (numbers, digit strings or opaque text alike), updates that move `updated_at`."""
    entity = cat.entity(name)
    table = fresh_sandbox.store.table(name)
    original = list(table.keys)
    stamps = [datetime.fromisoformat(r["updated_at"]) for r in table.rows if "updated_at" in r]
    others = {n: list(t.rows) for n, t in fresh_sandbox.store.tables.items() if n != name}
    fresh_sandbox.configure(drift_every=1)
    with api_client(fresh_sandbox) as client:
        for _ in range(30):
            client.get(name, params={"$top": "1"})
    changes = fresh_sandbox.control().changes()
    assert fresh_sandbox.stats()["injected_drift"] == 30
    assert {c["entity"] for c in changes} == {name}
    assert {c["kind"] for c in changes} == {"insert", "update", "delete"}
    inserted = [c["key"] for c in changes if c["kind"] == "insert"]
    order = sorted(original)
    assert any(k < order[0] for k in inserted), "no insert before the first key"
    assert any(order[0] < k < order[-1] for k in inserted), "no insert between keys"
    assert any(k > order[-1] for k in inserted), "no insert after the last key"
    last = {c["key"]: c["kind"] for c in changes}  # a deleted key may come back as new
    assert all((k in table.by_key) == (kind != "delete") for k, kind in last.items())
    if "updated_at" in entity.by_name:
        updated = [table.get(c["key"]) for c in changes if c["kind"] == "update"]
        moved = [datetime.fromisoformat(r["updated_at"]) for r in updated if r is not None]
        assert moved and min(moved) >= max(stamps), "an update must move the change cursor"
    assert {n: list(t.rows) for n, t in fresh_sandbox.store.tables.items() if n != name} == others


def test_a_drift_script_changes_a_set_before_the_answer_to_its_nth_request(fresh_sandbox):
    """A change aimed at one moment of a read: before the answer to the 3rd request to
    Claims (requests to other sets do not count), an insert below every key and an update
    that moves a claim's `updated_at` (a date) to today; nothing before, nothing after."""
    table = fresh_sandbox.store.table("Claims")
    first, today = table.keys[0], fresh_sandbox.store.now.date()
    control = fresh_sandbox.control()
    script = [{"entity": "Claims", "request": 3, "inserts": 1, "updates": 1, "place": "before"}]
    assert control.faults(drift_script=script)["drift_script"][0]["place"] == "before"
    lowest = []
    with api_client(fresh_sandbox) as client:
        for name in ("Claims", "Branches", "Claims", "Branches", "Claims", "Claims"):
            body = client.get(name, params={"$top": "1", "$orderby": "id asc"}).json()
            if name == "Claims":
                lowest.append(body["value"][0]["id"])
    changes = control.changes()
    assert [(c["entity"], c["kind"]) for c in changes] == [
        ("Claims", "insert"),
        ("Claims", "update"),
    ]
    inserted, updated = changes[0]["key"], table.get(changes[1]["key"])
    assert inserted < first and lowest == [first, first, inserted, inserted]
    assert updated["updated_at"] == today.isoformat()
    assert [(name, options["$top"]) for name, options in fresh_sandbox.sandbox.served][-1] == (
        "Claims",
        "1",
    )


def test_a_drift_script_is_checked_when_set(fresh_sandbox):
    control = fresh_sandbox.control()
    for wrong in ({"entity": "Nope", "request": 1}, {"entity": "Claims", "request": 0}, 5):
        with pytest.raises(httpx.HTTPStatusError) as refused:
            control.faults(drift_script=[wrong])
        assert refused.value.response.status_code == 400
    assert fresh_sandbox.config.drift_script == ()


# -- the controls outside the spec --------------------------------------------------------


def test_advance_mutates_and_truth_reflects_it(fresh_sandbox):
    headers = {"x-api-key": fresh_sandbox.config.api_key}
    truth_before = httpx.get(f"{fresh_sandbox.origin}/_sandbox/truth", headers=headers).json()
    changes = httpx.post(
        f"{fresh_sandbox.origin}/_sandbox/advance",
        json={"seconds": 86400, "insert_fraction": 0.05},
        headers=headers,
    ).json()
    assert changes["Appointments"]["inserted"] > 0
    truth_after = httpx.get(f"{fresh_sandbox.origin}/_sandbox/truth", headers=headers).json()
    assert (
        len(truth_after["Appointments"])
        > len(truth_before["Appointments"]) - changes["Appointments"]["deleted"]
    )
    assert httpx.get(f"{fresh_sandbox.origin}/_sandbox/truth").status_code == 401


def test_controls_are_off_the_spec_paths(api):
    assert api.get("_sandbox/truth").status_code == 404


def test_plant_serves_a_hostile_record_as_given(fresh_sandbox):
    headers = {"x-api-key": fresh_sandbox.config.api_key}
    hostile = {"id": 10**9, "total_claim_amount": "12x.5", 'x"; drop table claims; --': 1}
    planted = httpx.post(
        f"{fresh_sandbox.origin}/_sandbox/plant",
        json={"entity": "Claims", "record": hostile},
        headers=headers,
    )
    assert planted.status_code == 200
    with api_client(fresh_sandbox) as client:
        body = client.get("Claims", params={"$filter": f"id eq {10**9}"}).json()
    assert body["value"] == [hostile]
    unknown = httpx.post(
        f"{fresh_sandbox.origin}/_sandbox/plant",
        json={"entity": "Nope", "record": {}},
        headers=headers,
    )
    assert unknown.status_code == 400
    assert "Nope" in unknown.json()["error"]["message"]
