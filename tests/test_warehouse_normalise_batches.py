"""A record's fate does not depend on the batch it arrives in.

Normalisation converts whole columns and takes slower, more careful paths only when some
value in the column needs one, so the same record meets different code beside different
neighbours. Whatever the path, a record lands with the same values and the same notes (or,
without a usable key, is rejected for the same reasons) as when it is normalised alone, and
every landed value is one a Python client can read. The values are the hostile ones: wrong JSON kinds, numbers at the edges of BIGINT,
years 0 and 10000, leap seconds, impossible dates, fractions in integer fields.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS, Canonical, EntitySet
from tests.warehouse_records import record
from warehouse.normalise import NormalisedBatch, normalise

ANY_KIND = [None, True, False, 0, -1, 1.5, 2.0, 1e20, 2**63, 2**64, "", "abc", {}, [], "007", " 1"]
BY_TYPE: dict[Canonical, list[object]] = {
    Canonical.BIGINT: [5, "123", "-5", 10**18, "9223372036854775807", "9223372036854775808"],
    Canonical.DECIMAL: ["0.10", "99999999999999.9999", "100000000000000", "0.00001", 0.1, 3],
    Canonical.DATE: ["2024-02-29", "2026-02-29", "2026-13-01", "0000-01-01", "9999-12-31"],
    Canonical.TIMESTAMPTZ: [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00+14:00",
        "2026-01-01T10:00:00.1234567Z",
        "2026-01-01 10:00",
        "2026-01-01T23:59:60Z",
        "2026-02-30T00:00:00Z",
        "0000-01-01T00:00:00Z",
        "9999-12-31T23:59:59-05:00",
        "0001-01-01T00:00:00+01:00",
    ],
    Canonical.TIME: ["00:00:00", "23:59:59", "24:00:00", "9:00:00"],
    Canonical.BOOLEAN: [True, False],
    Canonical.VARCHAR: ["x", "Zoë", 42, "x" * 300, "Zo\ud83d"],  # half a surrogate pair
}
MISSING, SAMPLE = object(), object()  # a field left out; a field keeping its good sample


def records_of(entity: EntitySet) -> st.SearchStrategy[dict]:
    """Records of `entity` in which each field is a good sample half the time, else a hostile
    value of its type or of any kind, or absent."""
    fields = [f for f in entity.fields if f.name != entity.key]
    hostile = [st.sampled_from([*BY_TYPE[f.canonical], *ANY_KIND, MISSING]) for f in fields]
    values = [st.one_of(st.just(SAMPLE), h) for h in hostile]

    def build(key: int, chosen: tuple[object, ...]) -> dict:
        out = record(entity, key)
        for fld, value in zip(fields, chosen, strict=True):
            if value is MISSING:
                del out[fld.name]
            elif value is not SAMPLE:
                out[fld.name] = value
        return out

    return st.builds(build, st.integers(1, 10**6), st.tuples(*values))


def fates(batch: NormalisedBatch) -> tuple[list[dict], list[tuple]]:
    """Landed rows in order; the notes of each record (reasons are grouped by kind)."""
    notes = sorted((r.key, r.kind, r.fields, r.reason, r.raw_json) for r in batch.rejects)
    return batch.table.to_pylist(), notes


def check_batch_is_its_records(entity: EntitySet, records: list[dict]) -> None:
    whole = normalise(entity, records)
    alone = [fates(normalise(entity, [r])) for r in records]
    rows, notes = fates(whole)  # to_pylist: every landed value is readable by Python
    assert rows == [row for one, _ in alone for row in one]
    assert notes == sorted(note for _, some in alone for note in some)
    assert len(rows) + len(whole.errors) == len(records)


def some_records(entity: EntitySet):
    return st.lists(records_of(entity), min_size=2, max_size=6)


HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@HYPOTHESIS
@given(some_records(CLAIMS))
@example(  # an id sent as 1.5 beside a good one: pyarrow alone would truncate it to 1
    [record(CLAIMS, 1, prescription_id=1.5), record(CLAIMS, 2, prescription_id=7)]
)
@example(  # a 19-digit id sent as a number, beside one sent as text
    [record(CLAIMS, 1, prescription_id=10**18), record(CLAIMS, 2, prescription_id="7")]
)
@example(  # year 0 passes Arrow's cast of the whole column, not the careful path
    [record(CLAIMS, 1, date_of_service="0000-01-01"), record(CLAIMS, 2, date_of_service="x")]
)
def test_claims_batch_is_its_records(records):
    check_batch_is_its_records(CLAIMS, records)


@HYPOTHESIS
@given(some_records(APPOINTMENTS))
@example(  # a leap second sends the column down the careful path, which met year 10000
    [
        record(APPOINTMENTS, 1, start_datetime="2026-01-01T23:59:60Z"),
        record(APPOINTMENTS, 2, start_datetime="9999-12-31T23:59:59-05:00"),
    ]
)
def test_appointments_batch_is_its_records(records):
    check_batch_is_its_records(APPOINTMENTS, records)
