"""Issue 29's cases on a real lake and DuckDB file: what the service sent, the spec allowing
it, is what the warehouse holds, record for record and value for value."""

from __future__ import annotations

from decimal import Decimal

import pytest

from connectors.clinical_records.catalogue import (
    APPOINTMENTS,
    CLAIMS,
    DOCUMENTS,
    PATIENTS,
    PHYSICIANS,
    PRESCRIPTIONS,
)
from tests.warehouse_records import Harness, record


def notes(harness: Harness) -> list[tuple]:
    """Every reject and every value kept raw: none of the cases here may have any."""
    return harness.rows(
        'SELECT "kind", "fields", "reason" FROM "ops"."rejects" WHERE "kind" <> \'warning\''
    )


def test_a_document_uploaded_by_a_client_keeps_its_uploader(harness):
    """Documents uploaded through the API came back with `uploaded_by_id` "client-f75a…"
    (spec: string, "Uploading user"); they were rejected as "not an integer"."""
    sent = record(DOCUMENTS, 1, uploaded_by_id="client-f75a91c2", patient_id="00123")
    result = harness.sync(DOCUMENTS, [sent])
    assert (result.inserted, result.rejected) == (1, 0)
    assert harness.rows(
        'SELECT "uploaded_by_id", "patient_id" FROM "clinical"."patient_documents"'
    ) == [("client-f75a91c2", "00123")]
    assert notes(harness) == []


@pytest.mark.parametrize(("entity", "table"), [(PATIENTS, "patients"), (PHYSICIANS, "physicians")])
def test_ids_with_and_without_leading_zeros_are_two_records(harness, entity, table):
    """ "00123" and "123" loaded as one record: the merge kept the newer, the other was gone."""
    result = harness.sync(
        entity,
        [
            record(entity, 1, id="00123", last_name="Early"),
            record(entity, 2, id="123", last_name="Late"),
        ],
    )
    assert result.inserted == 2
    rows = harness.rows(f'SELECT "id", "last_name" FROM "clinical"."{table}" ORDER BY "id"')
    assert rows == [("00123", "Early"), ("123", "Late")]
    assert notes(harness) == []


def test_user_names_location_codes_and_empty_references_load_as_sent(harness):
    """A user id that is a name, a location code where a branch is expected, and an empty
    string in an optional reference each rejected the whole patient or appointment."""
    patient = record(
        PATIENTS,
        1,
        created_by_id="dr.jones",
        primary_practitioner_id="Mary Smith",
        primary_branch_id="",
        primary_caregiver_id="",
    )
    appointment = record(
        APPOINTMENTS,
        1,
        user_id="mjones",
        user_two_id="",
        created_by_id="kiosk",
        updated_by_id="System",
        branch_id="N01",
        prescription_id="",
    )
    assert harness.sync(PATIENTS, [patient]).rejected == 0
    assert harness.sync(APPOINTMENTS, [appointment]).rejected == 0
    assert harness.rows(
        'SELECT "created_by_id", "primary_practitioner_id", "primary_branch_id", '
        '"primary_caregiver_id" FROM "clinical"."patients"'
    ) == [("dr.jones", "Mary Smith", "", "")]
    assert harness.rows(
        'SELECT "user_id", "user_two_id", "created_by_id", "updated_by_id", "branch_id", '
        '"prescription_id" FROM "clinical"."appointments"'
    ) == [("mjones", "", "kiosk", "System", "N01", "")]
    assert notes(harness) == []


def test_prescription_created_at_keeps_date_only_and_offset_less_text(harness):
    """The spec types it `string`, "Date/time created", no format: a date-only value was
    rejected and one without an offset was silently taken as UTC."""
    sent = {1: "2026-11-01", 2: "2026-11-01T10:00:00", 3: "2026-11-01T10:00:00+05:30"}
    result = harness.sync(
        PRESCRIPTIONS, [record(PRESCRIPTIONS, k, created_at=v) for k, v in sent.items()]
    )
    assert (result.inserted, result.rejected) == (3, 0)
    held = dict(harness.rows('SELECT "id", "created_at" FROM "clinical"."prescriptions"'))
    assert held == {str(k): v for k, v in sent.items()}
    assert notes(harness) == []


def test_decimals_in_every_form_the_spec_allows_are_exact(harness):
    """Six fractional digits, `+12.50` and `.5` (the sandbox's own OpenAPI pattern accepts
    them) rejected the record under DECIMAL(18,4)."""
    sent = {1: "12.345678", 2: "+12.50", 3: ".5", 4: "-0.000001", 5: "0012.", 6: "-.25"}
    harness.sync(CLAIMS, [record(CLAIMS, k, total_claim_amount=v) for k, v in sent.items()])
    held = dict(harness.rows('SELECT "id", "total_claim_amount" FROM "clinical"."claims"'))
    assert held == {k: Decimal(v) for k, v in sent.items()}
    assert notes(harness) == []


def test_a_time_of_24_00_00_is_loaded(harness):
    """`24:00:00`, the end of a day in HH:MM:SS, rejected the appointment."""
    result = harness.sync(
        APPOINTMENTS, [record(APPOINTMENTS, 1, start_time="23:00:00", end_time="24:00:00")]
    )
    assert result.rejected == 0
    assert harness.rows(
        'SELECT "end_time" = TIME \'24:00:00\', "end_time" > "start_time", "end_time"::VARCHAR '
        'FROM "clinical"."appointments"'
    ) == [(True, True, "24:00:00")]
    assert notes(harness) == []
