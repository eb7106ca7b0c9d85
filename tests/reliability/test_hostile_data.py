"""Case 3: malformed and hostile records served by the sandbox; each gets its documented
handling and every good row of the same page still lands. A value outside its type costs
that value alone (kept as sent in `_extras`, counted); only a record without a usable key
is rejected."""

from __future__ import annotations

import json

import pytest

from connectors.clinical_records.catalogue import entity
from connectors.sandbox.server import SandboxServer
from tests.reliability.conftest import (
    SIZE,
    Target,
    assert_matches,
    compare,
    sandbox_config,
    truth,
)
from warehouse.load import status as warehouse_status

pytestmark = pytest.mark.reliability

CLAIMS, PATIENTS = entity("Claims"), entity("Patients")
SQL_NAME = 'x"); DROP TABLE "clinical"."claims"; --'
HUGE_TEXT = "H" * 40_000  # a page of such records is several megabytes

# key -> (the change that spoils a value of a good record, the field kept raw)
KEPT_RAW: dict[int, tuple[dict, str]] = {
    9_000_001: ({"billing_branch_id": "north"}, "billing_branch_id"),  # a string for a number
    9_000_002: ({"date_of_service": "2026-02-30"}, "date_of_service"),  # no such day
    9_000_003: ({"total_claim_amount": "12.5O"}, "total_claim_amount"),  # a letter O
    9_000_004: ({"total_claim_paid": "1" * 27 + ".5"}, "total_claim_paid"),  # too many digits
    9_000_005: ({"prescription_id": 1.5}, "prescription_id"),  # would be truncated to 1
    9_000_006: ({"date_of_service": "0000-01-01"}, "date_of_service"),  # year 0
}
# key -> change kept: the row lands, the oddity is noted or kept.
KEPT: dict[int, dict] = {
    9_000_011: {"loyalty_tier": "gold"},  # a field the catalogue does not know
    9_000_012: {SQL_NAME: "1; DROP TABLE x"},  # a field name built to break SQL
}


def good_claim(template: dict, key: int, **changes: object) -> dict:
    return {**template, "id": key, **changes}


def plant(server: SandboxServer, name: str, record: dict) -> None:
    server.control().plant(name, record)


def test_hostile_records_are_rejected_or_kept_and_good_rows_land(tmp_path, ledger):
    with SandboxServer(sandbox_config(seed=43)) as server:
        template = dict(truth(server)["Claims"][0])
        for key, (change, _) in KEPT_RAW.items():
            plant(server, "Claims", good_claim(template, key, **change))
        for key, change in KEPT.items():
            plant(server, "Claims", good_claim(template, key, **change))
        missing_id = {k: v for k, v in good_claim(template, 0).items() if k != "id"}
        missing_id["additional_info"] = "no id"
        plant(server, "Claims", missing_id)
        plant(server, "Claims", good_claim(template, 0, id="9000007"))  # a key sent as text
        huge = [9_100_000 + i for i in range(100 * SIZE)]
        for key in huge:
            plant(server, "Claims", good_claim(template, key, additional_info=HUGE_TEXT))
        long_name = dict(truth(server)["Patients"][0], id="990001", first_name="N" * 60)
        plant(server, "Patients", long_name)
        server.control().faults(garble_rate=0.15)  # 200s with cut or non-JSON bodies

        target = Target(server, tmp_path)
        report = target.sync_in_process(only=["Claims", "Patients"])
        stats = server.control().stats()
        ledger.add_faults(stats)
        assert stats.get("injected_garble", 0) > 0, stats

        # Every good row, hostile neighbours and huge pages included, equals the source.
        assert_matches(compare(target, entities=[CLAIMS, PATIENTS]), ledger)
        held = {r[0] for r in target.query('SELECT "id" FROM "clinical"."claims"')}
        assert set(huge) <= held and set(KEPT) <= held and set(KEPT_RAW) <= held

        # A value that does not fit: null, kept as sent in _extras, noted and counted.
        notes = target.query(
            'SELECT "key", "fields", "reason", "raw_json" FROM "ops"."rejects" '
            'WHERE "entity" = ? AND "kind" = ?',
            ["Claims", "unfit"],
        )
        by_key = {r[0]: r for r in notes}
        assert len(notes) == len(KEPT_RAW)
        for key, (change, name) in KEPT_RAW.items():
            _, fields, reason, raw = by_key[str(key)]
            assert fields == [name] and reason.startswith(name), reason
            assert json.loads(raw)["id"] == key
            ((value, extras),) = target.query(
                f'SELECT "{name}", "_extras" FROM "clinical"."claims" WHERE "id" = ?', [key]
            )
            assert value is None and json.loads(extras) == change
        check = {c.name: c for c in report.checks if c.table == "claims"}["no_rejects"]
        assert not check.passed and check.severity == "WARN"
        assert check.metadata["kept_raw"] == len(KEPT_RAW)
        assert check.metadata["field date_of_service"] == 2
        (claims,) = [s for s in warehouse_status(target.warehouse) if s.entity == "Claims"]
        assert (claims.unfit, claims.rejects) == (len(KEPT_RAW), 2)

        # Only a record without a usable key is rejected.
        rejects = target.query(
            'SELECT "key", "kind", "fields", "reason", "raw_json" FROM "ops"."rejects" '
            'WHERE "entity" = ? AND "kind" = ?',
            ["Claims", "reject"],
        )
        no_key = [r for r in rejects if r[0] is None]
        assert len(no_key) == 1 and "id" in no_key[0][2] and "required" in no_key[0][3]
        as_text = [r for r in rejects if r[0] == "9000007"]
        assert (
            len(as_text) == 1 and "a JSON string where the spec sends an integer" in as_text[0][3]
        )
        assert len(rejects) == 2
        assert report.entities["Claims"]["rows_rejected"] == len(rejects)
        ledger.bad_rows_rejected += len(rejects)

        # Unknown members are kept in `_extras`, a hostile name as plain data.
        extras = dict(
            target.query(
                'SELECT "id", "_extras" FROM "clinical"."claims" WHERE "_extras" IS NOT NULL'
            )
        )
        assert json.loads(extras[9_000_011]) == {"loyalty_tier": "gold"}
        assert json.loads(extras[9_000_012]) == {SQL_NAME: "1; DROP TABLE x"}
        # A string over the spec's max length is kept in full, with a warning.
        ((first_name,),) = target.query(
            'SELECT "first_name" FROM "clinical"."patients" WHERE "id" = ?', ["990001"]
        )
        assert first_name == "N" * 60
        warnings = target.query(
            'SELECT "reason" FROM "ops"."rejects" WHERE "key" = ? AND "kind" = ?',
            ["990001", "warning"],
        )
        assert warnings and "max length" in warnings[0][0]
