"""Every value the spec allows survives the normaliser; every other value costs only itself.

Each field draws from its spec type (section 2, type notes), in every shape the type allows:
strings of any shape (empty, leading zeros, long digit runs, names where an id is expected),
a number where the spec says string, decimal text with signs, leading zeros and points at
either end, date-times in every RFC 3339 / ISO 8601 extended spelling with an offset and
fractions of any length, dates, times up to 24:00:00. Now and then a value outside the type
(a string where it says number, no offset, digits beyond the decimal's) stands in.

For a record with a usable key: no reject; strings byte for byte, decimals exactly, instants
equal; a value that does not fit is null (a fraction finer than a microsecond: cut), kept as
sent in `_extras` under its name, and noted once (kind "unfit") naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    Canonical,
    Edm,
    EntitySet,
    Field,
)
from warehouse.normalise import normalise
from warehouse.schema import EXTRAS

INTEGER_DIGITS = DECIMAL_PRECISION - DECIMAL_SCALE


@dataclass(frozen=True)
class Sent:
    """A value as sent, what the warehouse must hold for it, and whether it fits its column
    (a date-time finer than a microsecond fits cut: `held` is the cut instant, `fits` is
    False, for it is kept as sent as well)."""

    value: Any
    held: Any
    fits: bool = True


TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
STRINGS = st.one_of(
    TEXT,
    st.just(""),
    st.from_regex(r"0[0-9]{0,12}", fullmatch=True),  # leading zeros: "00123" is not "123"
    st.from_regex(r"[0-9]{19,40}", fullmatch=True),  # beyond any integer type
    st.uuids().map(str),
    st.from_regex(r"client-[0-9a-f]{8}", fullmatch=True),  # an uploader that is a client
    st.sampled_from(["N01", "dr.jones", "Zoë O'Brien", " 12 ", "0", "-0"]),
)


def strings() -> st.SearchStrategy[Sent]:
    as_text = STRINGS.map(lambda s: Sent(s, s))
    as_number = st.integers().map(lambda n: Sent(n, str(n)))  # a number is its text
    return st.one_of(as_text, as_text, as_text, as_number)


def integers(fld: Field) -> st.SearchStrategy[Sent]:
    text = fld.canonical is Canonical.VARCHAR  # a family that is a string elsewhere
    spec = st.integers(-(2**31), 2**31 - 1).map(lambda n: Sent(n, str(n) if text else n))
    outside = st.one_of(
        st.from_regex(r"[0-9]{1,5}", fullmatch=True).map(lambda s: Sent(s, None, False)),
        st.just(Sent(1.5, None, False)),
    )
    return st.one_of(spec, spec, spec, outside)


@st.composite
def decimals(draw: st.DrawFn) -> Sent:
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.from_regex(rf"0{{0,3}}[0-9]{{0,{INTEGER_DIGITS}}}", fullmatch=True))
    fraction = draw(st.from_regex(rf"[0-9]{{0,{DECIMAL_SCALE}}}0{{0,4}}", fullmatch=True))
    point = draw(st.booleans()) or not whole
    if not whole and not fraction:
        whole = "0"
    text = f"{sign}{whole}{'.' if point else ''}{fraction if point else ''}"
    return Sent(text, Decimal(text))


def decimals_any() -> st.SearchStrategy[Sent]:
    beyond = st.one_of(
        st.from_regex(rf"[1-9][0-9]{{{INTEGER_DIGITS}}}(\.5)?", fullmatch=True),
        st.from_regex(rf"0\.[0-9]{{{DECIMAL_SCALE}}}[1-9]", fullmatch=True),
        st.sampled_from(["1e3", "12,50", "NaN", "", "."]),
    ).map(lambda s: Sent(s, None, False))
    return st.one_of(decimals(), decimals(), decimals(), beyond)


def dates() -> st.SearchStrategy[Sent]:
    spec = st.dates(date(1, 1, 1), date(9999, 12, 31)).map(
        lambda d: Sent(f"{d.year:04d}-{d.month:02d}-{d.day:02d}", d)
    )
    outside = st.sampled_from(["2026-02-30", "01/02/2026", "2026-1-1"])
    return st.one_of(spec, spec, spec, outside.map(lambda s: Sent(s, None, False)))


def times() -> st.SearchStrategy[Sent]:
    seconds = st.integers(0, 86_400)  # 86_400: 24:00:00, the end of the day
    spec = seconds.map(
        lambda s: Sent(f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}", s * 1_000_000)
    )
    outside = st.sampled_from(["24:00:01", "9:00:00", "12:00"])
    return st.one_of(spec, spec, spec, outside.map(lambda s: Sent(s, None, False)))


@st.composite
def datetimes(draw: st.DrawFn) -> Sent:
    """An instant written in one of the spellings RFC 3339 and ISO 8601 extended allow."""
    minutes = draw(st.integers(-23 * 60 - 59, 23 * 60 + 59))
    zone = timezone(timedelta(minutes=minutes))
    local = draw(
        st.datetimes(datetime(2, 1, 1), datetime(9998, 12, 31)).map(
            lambda d: d.replace(tzinfo=zone)
        )
    )
    digits = draw(st.integers(0, 9))
    extra = draw(st.from_regex(r"[0-9]{3}", fullmatch=True)) if digits > 6 else ""
    fraction = (f"{local.microsecond:06d}" + extra)[:digits]
    if digits < 6:  # the instant is what the text says
        local = local.replace(microsecond=int(fraction.ljust(6, "0") or 0))
    clock = f"{local.hour:02d}:{local.minute:02d}"
    if local.second or fraction or draw(st.booleans()):
        clock += f":{local.second:02d}"
        if fraction:
            clock += draw(st.sampled_from([".", ","])) + fraction
    sign, rest = ("-" if minutes < 0 else "+"), abs(minutes)
    hh, mm = divmod(rest, 60)
    offsets = [f"{sign}{hh:02d}:{mm:02d}", f"{sign}{hh:02d}{mm:02d}"]
    if mm == 0:
        offsets.append(f"{sign}{hh:02d}")
    if minutes == 0:
        offsets += ["Z", "z"]
    offset = draw(st.sampled_from(offsets))
    separator = draw(st.sampled_from(["T", "t", " "]))
    text = f"{local.year:04d}-{local.month:02d}-{local.day:02d}{separator}{clock}{offset}"
    finer = digits > 6 and extra[: digits - 6].strip("0") != ""
    return Sent(text, local.astimezone(UTC), not finer)


def datetimes_any() -> st.SearchStrategy[Sent]:
    outside = st.sampled_from(["2026-11-01T10:00:00", "2026-11-01", "2026-02-30T10:00:00Z"])
    return st.one_of(
        datetimes(), datetimes(), datetimes(), outside.map(lambda s: Sent(s, None, False))
    )


def spec_values(fld: Field) -> st.SearchStrategy[Sent]:
    """Values of the field's spec type (and its stated format), and now and then one outside."""
    if fld.parse_as is Canonical.DATE:
        return dates()
    if fld.parse_as is Canonical.TIME:
        return times()
    by_type = {
        Edm.STRING: strings,
        Edm.INT32: lambda: integers(fld),
        Edm.DECIMAL: decimals_any,
        Edm.BOOLEAN: lambda: st.booleans().map(lambda b: Sent(b, b)),
        Edm.DATE: dates,
        Edm.DATETIME: datetimes_any,
    }
    values = by_type[fld.type]()
    if fld.required:
        return values
    return st.one_of(values, st.just(Sent(None, None)))


def keys(entity: EntitySet) -> st.SearchStrategy[Any]:
    """Usable keys: any non-empty string (leading zeros and all), or a spec integer."""
    if entity.key_field.type is Edm.INT32:
        return st.integers(-(2**31), 2**31 - 1)
    return st.one_of(STRINGS, st.sampled_from(["00123", "123", "0123"])).filter(bool)


@st.composite
def batches(draw: st.DrawFn) -> tuple[EntitySet, list[dict[str, Sent]]]:
    entity = draw(st.sampled_from(ALL_ENTITIES))
    ids = draw(st.lists(keys(entity), min_size=1, max_size=6, unique=True))
    others = [f for f in entity.fields if f.name != entity.key]
    records = []
    for key in ids:
        held = key if entity.key_field.canonical is Canonical.BIGINT else str(key)
        sent = {entity.key: Sent(key, held)}
        sent.update({f.name: draw(spec_values(f)) for f in others})
        records.append(sent)
    return entity, records


def held_values(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as Python values; a time as microseconds (Python's `time` has no 24:00)."""
    rows = table.to_pylist()
    for name in table.column_names:
        if table.schema.field(name).type == pa.time64("us"):
            micros = table.column(name).combine_chunks().view(pa.int64()).to_pylist()
            for row, value in zip(rows, micros, strict=True):
                row[name] = value
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches())
def test_every_spec_value_survives_and_every_other_costs_only_itself(drawn):
    entity, sent = drawn
    records = [{name: s.value for name, s in one.items()} for one in sent]
    batch = normalise(entity, records)

    assert batch.errors == []  # every key is usable: nothing is rejected
    rows = held_values(batch.table)
    assert len(rows) == len(records)
    noted = {r.key: set(r.fields) for r in batch.unfit}
    assert len(noted) == len(batch.unfit)  # one note per record
    for row, one in zip(rows, sent, strict=True):
        key = str(one[entity.key].value)
        unfit = {name for name, s in one.items() if not s.fits}
        for name, s in one.items():
            if s.fits or s.held is not None:  # fits, or a date-time cut to microseconds
                assert row[name] == s.held, (entity.name, name, s.value, row[name])
                if isinstance(s.held, str):
                    assert row[name].encode() == s.held.encode()  # byte for byte
            else:
                assert row[name] is None, (entity.name, name, s.value)
        assert noted.get(key, set()) == unfit, (entity.name, key)
        extras = json.loads(row[EXTRAS]) if row[EXTRAS] else {}
        assert extras == {name: one[name].value for name in unfit}, (entity.name, key)
