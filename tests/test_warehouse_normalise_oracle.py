"""Normalisation against a reference written with Python's own types, value by value.

normalise converts columns with regular expressions and Arrow casts; here each text is
built from hostile parts (year 0, month 13, hour 24, leap seconds, seven-digit fractions,
lower-case `t` and `z`, offsets beyond a day, no offset, leading zeros, signs, digits beyond
DECIMAL(38,12)) and what lands must be what `datetime`, `date`, `time` and `Decimal` say;
where they refuse, the column is null and the value is kept as sent in `_extras`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_DOWN, Decimal, localcontext

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from connectors.clinical_records.catalogue import APPOINTMENTS, CLAIMS, EntitySet
from tests.warehouse_records import record
from warehouse.normalise import normalise

DATETIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:[.,]([0-9]+))?)?([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)"
)


def expected_datetime(text: str) -> datetime | None:
    """ISO 8601 with an offset (without one, no instant), fractions cut to microseconds,
    in UTC."""
    match = DATETIME.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micros = int((fraction or "")[:6].ljust(6, "0"))
    shift = timedelta()
    if offset not in "Zz":
        digits = offset[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:] or 0)
        if hours > 23 or minutes > 59:
            return None
        shift = timedelta(hours=hours, minutes=minutes) * (-1 if offset[0] == "-" else 1)
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute))
        local = local.replace(second=int(second or 0), microsecond=micros)
        return (local - shift).replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None


def _iso_reader(shape: str, parse: Callable[[str], object]) -> Callable[[str], object]:
    """Text of `shape` (ASCII digits), read by Python's own ISO reader; None otherwise."""

    def read(text: str) -> object:
        if not re.fullmatch(shape, text):
            return None
        try:
            return parse(text)
        except ValueError:
            return None

    return read


expected_date = _iso_reader(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date.fromisoformat)
_clock = _iso_reader(r"[0-9]{2}:[0-9]{2}:[0-9]{2}", time.fromisoformat)


def expected_time(text: str) -> int | None:
    """Microseconds since midnight: 24:00:00, the end of the day, is a day's worth."""
    if text == "24:00:00":
        return 86_400_000_000
    clock = _clock(text)
    return None if clock is None else (clock.hour * 3600 + clock.minute * 60 + clock.second) * 10**6


def expected_text(text: str) -> str:
    return text


def expected_decimal(text: str) -> Decimal | None:
    """Exact in DECIMAL(38,12): at most 26 digits before the point and 12 after (zeros aside)."""
    if not re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", text):
        return None
    with localcontext() as exact:
        exact.prec = 200
        value = Decimal(text)
        if value != value.quantize(Decimal(10) ** -12, rounding=ROUND_DOWN):
            return None
    return value if abs(value) < 10**26 else None


def texts(*parts: list[str]) -> st.SearchStrategy[str]:
    return st.tuples(*(st.sampled_from(p) for p in parts)).map("".join)


YEARS = ["0000", "0001", "1969", "2024", "2026", "9999", "202"]
MONTHS = ["-01", "-02", "-12", "-13", "-00", "-1"]
DAYS = ["-01", "-28", "-29", "-30", "-31", "-32", "-00"]
DATES = texts(YEARS, MONTHS, DAYS)
CLOCK = texts(["00", "09", "23", "24", "9"], [":00", ":59", ":60"], ["", ":00", ":59", ":60"])
DATETIMES = texts(
    YEARS,
    MONTHS,
    DAYS,
    ["T", " ", "t"],
    ["00", "09", "23", "24"],
    [":00", ":59", ":60"],
    ["", ":00", ":59", ":60"],
    ["", ".5", ",5", ".123456", ".1234567", ".1234560", ".999999999", "."],
    ["", "Z", "z", "+00:00", "-00:00", "+14:00", "-12:30", "+0530", "+05", "+24:00", "+23:60"],
)
TIMES = texts(["00", "09", "23", "24", "9"], [":00", ":59", ":60"], [":00", ":59", ":60", ""])
INTEGERS = texts(
    ["", "-", "+", "0x", "0X"],  # Arrow's own parser reads 0x1F as 31; JSON has no such integer
    ["0", "00000000000000000001", "7", "9223372036854775807", "1F"],
    ["", "8"],
)
DECIMALS = texts(
    ["", "-", "+"],
    ["", "0", "1", "99999999999999999999999999", "1" + "0" * 26, "000000000000000000000000000012"],
    ["", ".1", ".000001", ".000000000001", ".0000000000001", ".10000000000000", ".", "e3", "e-13"],
    ["", "0000000000000000", "e2"],
)
NOISE = st.text(alphabet="0123456789-:.TZ+ xX", max_size=12)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def check(entity: EntitySet, values: list[dict[str, str]], expect: dict) -> None:
    """Each record carries `values`; it lands with what `expect` says, and where `expect`
    refuses, the field is null, its text kept as sent in `_extras` and noted."""
    records = [record(entity, i, **sent) for i, sent in enumerate(values)]
    batch = normalise(entity, records)
    assert not batch.errors
    table = batch.table
    rows = table.to_pylist()
    for name in values[0]:
        if table.schema.field(name).type == pa.time64("us"):  # 24:00:00 reads as 00:00 in Python
            micros = table.column(name).combine_chunks().view(pa.int64()).to_pylist()
            for row, value in zip(rows, micros, strict=True):
                row[name] = value
    landed = {row[entity.key]: row for row in rows}
    noted = {r.key: set(r.fields) for r in batch.unfit}
    for record_, sent in zip(records, values, strict=True):
        key = record_[entity.key]
        wanted = {name: expect[name](text) for name, text in sent.items()}
        bad = {name for name, value in wanted.items() if value is None}
        fine = {name for name, text in sent.items() if FINER.search(text) and name not in bad}
        row = landed[key]
        assert {name: row[name] for name in sent} == wanted, sent
        assert noted.get(str(key), set()) == bad | fine, sent
        kept = json.loads(row["_extras"]) if row["_extras"] else {}
        assert kept == {name: sent[name] for name in bad | fine}, sent


FINER = re.compile(r":[0-9]{2}[.,][0-9]{6}0*[1-9]")  # a digit past the microsecond
APPOINTMENT_EXPECT = {
    "appointment_date": expected_date,
    "start_time": expected_time,
    "start_datetime": expected_datetime,
    "patient_id": expected_text,
}
APPOINTMENT_VALUES = st.fixed_dictionaries(
    {
        "appointment_date": st.one_of(DATES, NOISE),
        "start_time": st.one_of(TIMES, CLOCK, NOISE),
        "start_datetime": st.one_of(DATETIMES, NOISE),
        "patient_id": st.one_of(INTEGERS, NOISE),
    }
)


@SETTINGS
@given(st.lists(APPOINTMENT_VALUES, min_size=1, max_size=8))
@example(
    [
        {
            "appointment_date": "0001-01-01",
            "start_time": "23:59:59",
            "start_datetime": "2026-01-01T10:00:00.1234567+05:30",
            "patient_id": "00000000000000000001",
        },
        {
            "appointment_date": "2024-02-29",
            "start_time": "00:00:00",
            "start_datetime": "2026-01-01T10:00z",
            "patient_id": "-9223372036854775808",
        },
    ]
)
@example(
    [
        {
            "appointment_date": "2026-01-01",
            "start_time": "09:00:00",
            "start_datetime": "2026-01-01T10:00:00Z",
            "patient_id": hex_id,
        }
        for hex_id in ("0x1F", "0X7f", "12")
    ]
)
@example(
    [  # every value finer than microseconds: the whole column is cut and cast at once
        {
            "appointment_date": "2026-01-01",
            "start_time": "09:00:00",
            "start_datetime": fine,
            "patient_id": "1",
        }
        for fine in ("1969-12-31T23:59:59.9999999Z", "2026-01-01T10:00:00.1234567+05:30")
    ]
)
def test_appointment_values_are_what_python_reads(values):
    check(APPOINTMENTS, values, APPOINTMENT_EXPECT)


@SETTINGS
@given(st.lists(st.fixed_dictionaries({"total_claim_amount": DECIMALS}), min_size=1, max_size=8))
@example(  # one value beyond the precision sends the column down the careful path
    [{"total_claim_amount": t} for t in (".000", "+0012.50000000000000000", "1" * 27, "1.")]
)
@example(  # 27 digits: Arrow's cast alone wraps this past int128 into another number
    [{"total_claim_amount": "341000000000000000000000000"}]
)
def test_claim_amounts_are_what_decimal_reads(values):
    check(CLAIMS, values, {"total_claim_amount": expected_decimal})
