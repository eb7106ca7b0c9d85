"""The warehouse against the records as the service sent them, value by value, written from
the spec and not through the warehouse's own normaliser: strings byte for byte (a number
sent for a string family as its decimal text), decimals exactly, dates and times as written,
date-times as the same instant (to the microsecond: what a finer fraction says is kept as
sent in `_extras`), keys one to one (no two sent ids merged); and the analytics views
linking the pairs the sent references name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    Canonical,
    EntitySet,
    Field,
)

INSTANT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:[.,]([0-9]+))?)?([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)"
)
NOT_HELD = object()  # a value the column cannot hold: null there, kept as sent in _extras


def instant(text: str) -> tuple[Any, bool]:
    """(the instant `text` names, in UTC to the microsecond, or NOT_HELD; whether the text
    says more than the column holds, so that it is kept as sent as well)."""
    match = INSTANT.fullmatch(text)
    if match is None:
        return NOT_HELD, True
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    shift = timedelta()
    if offset not in ("Z", "z"):
        digits = offset[1:].replace(":", "")
        shift = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        shift = -shift if offset[0] == "-" else shift
    fraction = fraction or ""
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
        moment = (local - shift).replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return NOT_HELD, True
    moment += timedelta(microseconds=int(fraction[:6].ljust(6, "0")))
    return moment, fraction[6:].strip("0") != ""


def key_of(entity: EntitySet, sent: Any) -> Any:
    """The key the warehouse holds for a key sent: a number in a BIGINT family, else text."""
    if entity.key_field.canonical is Canonical.BIGINT:
        return sent
    return str(sent) if type(sent) is int else sent


def expected(fld: Field, sent: Any) -> tuple[Any, bool]:
    """(what the column must hold for `sent`, whether `_extras` must keep `sent` as well)."""
    if sent is None:
        return None, False
    kind = fld.canonical
    if kind is Canonical.VARCHAR:
        return (str(sent), False) if type(sent) is int else (sent, False)
    if kind is Canonical.DECIMAL:
        value = Decimal(sent)
        with localcontext() as wide:
            wide.prec = 2 * DECIMAL_PRECISION
            exact = value == value.quantize(Decimal(10) ** -DECIMAL_SCALE)
        fits = exact and abs(value) < 10 ** (DECIMAL_PRECISION - DECIMAL_SCALE)
        return (value, False) if fits else (NOT_HELD, True)
    if kind is Canonical.DATE:
        return date.fromisoformat(sent), False
    if kind is Canonical.TIME:
        return sent, False  # compared as text: 24:00:00 has no Python `time`
    if kind is Canonical.TIMESTAMPTZ:
        return instant(sent)
    return sent, False  # BIGINT, BOOLEAN: the JSON value itself


def held(path: Path, entity: EntitySet) -> dict[Any, dict[str, Any]]:
    """The live rows of `clinical.<table>` by key, a TIME as its text."""
    columns = ", ".join(
        f'CAST("{f.name}" AS VARCHAR) AS "{f.name}"'
        if f.canonical is Canonical.TIME
        else f'"{f.name}"'
        for f in entity.fields
    )
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        cursor = con.execute(
            f'SELECT {columns}, "_extras" FROM "clinical"."{entity.table}" '
            'WHERE "_deleted_at" IS NULL'
        )
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return {row[entity.key]: row for row in rows}


def differences(path: Path, sent: Mapping[str, Mapping[Any, dict]]) -> list[str]:
    """Every way the warehouse's live rows differ from the records sent (empty: none)."""
    problems: list[str] = []
    for entity in ALL_ENTITIES:
        records = sent[entity.name]
        rows = held(path, entity)
        wanted = {key_of(entity, k): r for k, r in records.items()}
        if len(wanted) != len(records):
            problems.append(f"{entity.name}: two sent keys are one key in the warehouse")
        for key in wanted.keys() - rows.keys():
            problems.append(f"{entity.name} {key!r}: missing")
        for key in rows.keys() - wanted.keys():
            problems.append(f"{entity.name} {key!r}: held, not sent")
        for key in wanted.keys() & rows.keys():
            record, row = wanted[key], rows[key]
            kept: dict[str, Any] = {}
            for fld in entity.fields:
                value, keep = expected(fld, record.get(fld.name))
                have = row[fld.name]
                if keep:
                    kept[fld.name] = record[fld.name]
                if (None if value is NOT_HELD else value) != have or (
                    isinstance(value, str) and value.encode() != have.encode()
                ):
                    problems.append(
                        f"{entity.name} {key!r}.{fld.name}: sent {record.get(fld.name)!r}, "
                        f"held {have!r}"
                    )
            extras = json.loads(row["_extras"]) if row["_extras"] else {}
            if extras != kept:
                problems.append(f"{entity.name} {key!r}: _extras {extras!r}, expected {kept!r}")
    return problems


def linked_pairs(path: Path) -> dict[str, set[tuple]]:
    """What the analytics views link: prescription to claim and to verification; per
    prescription, its patient's name, its branch's name and its physicians' names."""
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            "claims": set(
                con.execute(
                    "SELECT prescription_id, claim_id FROM analytics.prescription_claims"
                ).fetchall()
            ),
            "verifications": set(
                con.execute(
                    "SELECT prescription_id, verification_id "
                    "FROM analytics.prescription_verifications"
                ).fetchall()
            ),
            "summary": set(
                con.execute(
                    "SELECT prescription_id, patient_first_name, patient_last_name, branch_name, "
                    "referring_physician, primary_care_physician "
                    "FROM analytics.prescription_summary"
                ).fetchall()
            ),
        }


def sent_pairs(sent: Mapping[str, Mapping[Any, dict]]) -> dict[str, set[tuple]]:
    """The same pairs from the records sent: a reference names the record whose id is the
    same id (a number and its decimal text; "00123" is not 123)."""

    def same(one: Any) -> str | None:
        return None if one is None else str(one)

    def by_id(name: str) -> dict[str | None, dict]:
        return {same(k): r for k, r in sent[name].items()}

    prescriptions = by_id("Prescriptions")
    patients, branches, physicians = by_id("Patients"), by_id("Branches"), by_id("Physicians")

    def person(record: dict | None) -> str | None:
        """As `nullif(concat_ws(' ', first_name, last_name), '')`: nulls left out, and no one
        (no physician, or one without a name) NULL, never an empty text."""
        parts = (record or {}).get("first_name"), (record or {}).get("last_name")
        return " ".join(p for p in parts if p is not None) or None

    def children(name: str) -> set[tuple]:
        return {
            (same(c["prescription_id"]), key)
            for key, c in sent[name].items()
            if same(c.get("prescription_id")) in prescriptions
        }

    summary = set()
    for rx_id, rx in prescriptions.items():
        patient = patients.get(same(rx.get("patient_id")))
        branch = branches.get(same(rx.get("branch_id")))
        summary.add(
            (
                rx_id,
                (patient or {}).get("first_name"),
                (patient or {}).get("last_name"),
                (branch or {}).get("name"),
                person(physicians.get(same(rx.get("referring_physician_id")))),
                person(physicians.get(same(rx.get("primary_care_physician_id")))),
            )
        )
    return {
        "claims": children("Claims"),
        "verifications": children("InsuranceVerifications"),
        "summary": summary,
    }
