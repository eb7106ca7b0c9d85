"""JSON records -> a canonical Arrow table, column by column with pyarrow compute.

Only a record without a usable key is rejected. A value that does not fit its column (a
string where the spec says number, digits beyond the decimal's, a date-time without an
offset) costs that column's value alone: null there, the value kept as sent in `_extras`
under its field's name, and a note of kind "unfit" that the checks and `status` count.

The volume is in the rows, so nothing loops per value on the happy path: the records become
one Arrow struct array in C++, each column is checked with regular expressions and cast, and
failing rows are found with masks. Python touches single values only for the rare column
whose JSON kinds are mixed, for unknown members and for the rows that are rejected.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.clinical_records.catalogue import Edm, EntitySet, Field
from warehouse.converters import (
    ACCEPTED_KINDS,
    CONVERTERS,
    KIND_BY_TYPE,
    SPEC_SENDS,
    TEXT_BY_KIND,
    Rows,
    bool_mask,
)
from warehouse.schema import EXTRAS, arrow_schema, json_struct_type

log = logging.getLogger(__name__)

REJECT = "reject"  # no usable key: the record is not loaded
UNFIT = "unfit"  # loaded; the fields named are null (or cut), their values kept in `_extras`
WARNING = "warning"  # loaded as sent, with a note

Problem = tuple[str, np.ndarray, str]  # (field, mask of rows, why)


@dataclass(frozen=True)
class Reject:
    """A note on one record: rejected (kind "reject"), loaded with values kept raw
    ("unfit"), or loaded with a note ("warning")."""

    entity: str
    key: str | None
    kind: str
    fields: tuple[str, ...]
    reason: str
    raw_json: str


@dataclass
class NormalisedBatch:
    table: pa.Table
    rejects: list[Reject] = field(default_factory=list)
    unknown_fields: set[str] = field(default_factory=set)

    @property
    def errors(self) -> list[Reject]:
        return [r for r in self.rejects if r.kind == REJECT]

    @property
    def warnings(self) -> list[Reject]:
        return [r for r in self.rejects if r.kind == WARNING]

    @property
    def unfit(self) -> list[Reject]:
        return [r for r in self.rejects if r.kind == UNFIT]


def _loose_column(records: Sequence[dict], fld: Field) -> tuple[pa.Array, Rows]:
    """A column whose JSON kinds are mixed: accepted kinds as text, the others do not fit."""
    accepted = ACCEPTED_KINDS[fld.type]
    out: list[object] = []
    wrong: dict[str, np.ndarray] = {}
    for i, record in enumerate(records):
        value = record.get(fld.name)
        kind = KIND_BY_TYPE.get(type(value), "other") if value is not None else None
        if kind is None or kind in accepted:
            out.append(None if kind is None else TEXT_BY_KIND[kind](value))
            continue
        wrong.setdefault(kind, np.zeros(len(records), dtype=bool))[i] = True
        out.append(None)
    arrow_type = pa.bool_() if fld.type is Edm.BOOLEAN else pa.string()
    sends = SPEC_SENDS[fld.type]
    unfit = [(mask, f"a JSON {kind} where the spec sends {sends}") for kind, mask in wrong.items()]
    return pa.array(out, arrow_type), unfit


def _raw_columns(
    entity: EntitySet, records: Sequence[dict]
) -> tuple[dict[str, pa.Array], list[Problem]]:
    """Each known field as an Arrow array of its JSON type, or as text where kinds are mixed."""
    struct_type = json_struct_type(entity)
    unfit: list[Problem] = []
    loose = _floats_in_integers(struct_type, records)
    if not loose:
        try:
            struct = pa.array(records, type=struct_type)
            return {f.name: struct.field(f.name) for f in entity.fields}, unfit
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    columns: dict[str, pa.Array] = {}
    for fld in entity.fields:
        if fld.name not in loose:
            values = [r.get(fld.name) for r in records]
            try:
                columns[fld.name] = pa.array(values, type=struct_type.field(fld.name).type)
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                pass
        columns[fld.name], wrong = _loose_column(records, fld)
        unfit.extend((fld.name, mask, reason) for mask, reason in wrong)
    return columns, unfit


def _floats_in_integers(struct_type: pa.StructType, records: Sequence[dict]) -> set[str]:
    """Integer fields holding a JSON number with a fraction or exponent: pyarrow would
    truncate 1.5 to 1 without a word, so these columns take the loose path, where it does
    not fit."""
    integers = [f.name for f in struct_type if f.type == pa.int64()]
    return {name for name in integers if any(type(r.get(name)) is float for r in records)}


def _extras(records: Sequence[dict], unknown: list[str], unfit: dict[int, set[str]]) -> pa.Array:
    """Per record, what the columns do not hold as sent: its unknown members and the values
    that did not fit, each under its own name, in the record's order."""
    rows: list[str | None] = [None] * len(records)
    names = set(unknown)
    for i in range(len(records)) if names else sorted(unfit):
        kept = names | unfit.get(i, set())
        extra = {k: v for k, v in records[i].items() if k in kept}
        if extra:
            rows[i] = json.dumps(extra, ensure_ascii=False, default=str)
    return pa.array(rows, pa.string())


def _raw_json(record: object) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)


def _key_of(entity: EntitySet, record: object) -> str | None:
    """The key as sent, as text (a number as its decimal text)."""
    if isinstance(record, dict) and record.get(entity.key) is not None:
        return str(record[entity.key])
    return None


def normalise(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    """Records as the API sends them -> canonical table, rejects and unknown members."""
    try:
        return _normalise(entity, records)
    except UnicodeEncodeError:  # a lone UTF-16 surrogate somewhere (rare): not storable
        return _surrogates_replaced(entity, records)


def _surrogates_replaced(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    """JSON may escape half a UTF-16 pair (the "\\ud83d" of an emoji cut in two), which is not
    Unicode: neither Arrow nor DuckDB (nor a JSON column) can store it. Such text is kept with
    U+FFFD in its place, with a warning per record whose raw JSON spells each half out."""
    cleaned: list[object] = []
    notes: list[Reject] = []
    for record in records:
        if not _has_surrogate(record):
            cleaned.append(record)
            continue
        clean = _map_text(record, _replaced)
        cleaned.append(clean)
        members = record.items() if type(record) is dict else ()
        touched = [k for k, v in members if _has_surrogate(k) or _has_surrogate(v)]
        notes.append(
            Reject(
                entity.name,
                _key_of(entity, clean),
                WARNING,
                tuple(_replaced(k) for k in touched),
                "text held half a UTF-16 surrogate pair (not Unicode); kept with U+FFFD in its "
                "place (raw_json spells it as the text \\uXXXX)",
                _raw_json(_map_text(record, _spelled)),
            )
        )
    batch = _normalise(entity, cleaned)
    batch.rejects += notes
    return batch


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str, only a lone half matches


def _has_surrogate(value: object) -> bool:
    if type(value) is str:
        return _SURROGATE.search(value) is not None
    if type(value) is dict:
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if type(value) is list:
        return any(_has_surrogate(v) for v in value)
    return False


def _map_text(value: Any, change: Callable[[str], str]) -> Any:
    """`value` with `change` applied to every string in it, member names included."""
    if type(value) is str:
        return change(value)
    if type(value) is dict:
        return {change(k): _map_text(v, change) for k, v in value.items()}
    if type(value) is list:
        return [_map_text(v, change) for v in value]
    return value


def _replaced(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _spelled(text: str) -> str:
    return _SURROGATE.sub(lambda half: f"\\u{ord(half.group()):04x}", text)


def _normalise(entity: EntitySet, records: Sequence[object]) -> NormalisedBatch:
    schema = arrow_schema(entity)
    objects = [r for r in records if type(r) is dict]
    rejects = [
        Reject(entity.name, None, REJECT, (), "record is not a JSON object", _raw_json(r))
        for r in records
        if type(r) is not dict
    ]
    if not objects:
        return NormalisedBatch(schema.empty_table(), rejects)

    unknown = sorted(set().union(*objects) - set(entity.by_name))
    counts = {name: sum(name in r for r in objects) for name in unknown}

    raw, unfit = _raw_columns(entity, objects)
    warnings: list[Problem] = []
    columns: dict[str, pa.Array] = {}
    for fld in entity.fields:
        converted = CONVERTERS[fld.canonical](raw[fld.name], fld)
        unfit.extend((fld.name, m, why) for m, why in converted.unfit)
        warnings.extend((fld.name, m, why) for m, why in converted.warnings)
        columns[fld.name] = converted.values

    # Only a record without a usable key is rejected; any other value that does not fit
    # costs its column's value alone, kept as sent in `_extras`.
    key_errors = [p for p in unfit if p[0] == entity.key]
    unfit = [p for p in unfit if p[0] != entity.key]
    key = columns[entity.key]
    if pa.types.is_string(key.type):
        key_errors.append((entity.key, bool_mask(pc.equal(key, "")), "empty: names no record"))
    for fld in entity.fields:
        if fld.required:
            # Sent: not null as read, or nulled there for being of the wrong kind (noted).
            sent = bool_mask(raw[fld.name].is_valid())
            for name, mask, _ in (*key_errors, *unfit):
                if name == fld.name:
                    sent |= mask
            (key_errors if fld.name == entity.key else warnings).append(
                (fld.name, ~sent, "missing (required)")
            )
    rejected = np.zeros(len(objects), dtype=bool)
    for _, mask, _ in key_errors:
        rejected |= mask
    kept_raw: dict[int, set[str]] = {}
    for name, mask, _ in unfit:
        for i in np.flatnonzero(mask & ~rejected):
            kept_raw.setdefault(int(i), set()).add(name)
    extras = _extras(objects, unknown, kept_raw)
    table = pa.Table.from_arrays([*columns.values(), extras], schema=schema)

    rejects += _notes(entity, objects, key_errors + unfit, REJECT, rejected)
    rejects += _notes(entity, objects, unfit, UNFIT, ~rejected, f"; kept as sent in {EXTRAS}")
    rejects += _notes(entity, objects, warnings, WARNING, ~rejected)
    for name in unknown:
        example = next(r for r in objects if name in r)
        reason = f"field unknown to the catalogue in {counts[name]} records; kept in {EXTRAS}"
        rejects.append(
            Reject(entity.name, None, WARNING, (name,), reason, _raw_json(example)),
        )
    if unknown:
        log.warning("%s: %d unknown fields kept in %s", entity.name, len(unknown), EXTRAS)
    if kept_raw:
        log.warning("%s: %d records hold values kept in %s", entity.name, len(kept_raw), EXTRAS)
    if rejected.any():
        log.warning(
            "%s: %d of %d records rejected (no usable key)",
            entity.name,
            rejected.sum(),
            len(objects),
        )
        table = table.filter(pa.array(~rejected))
    return NormalisedBatch(table, rejects, set(unknown))


def _notes(
    entity: EntitySet,
    records: Sequence[dict],
    problems: list[Problem],
    kind: str,
    rows: np.ndarray,
    suffix: str = "",
) -> list[Reject]:
    """One Reject per affected row, its reasons joined: `field: why; ...`, then `suffix`."""
    by_row: dict[int, list[tuple[str, str]]] = {}
    for name, mask, why in problems:
        for i in np.flatnonzero(mask & rows):
            by_row.setdefault(int(i), []).append((name, why))
    return [
        Reject(
            entity.name,
            _key_of(entity, records[i]),
            kind,
            tuple(dict.fromkeys(name for name, _ in reasons)),
            "; ".join(f"{name}: {why}" for name, why in reasons) + suffix,
            _raw_json(records[i]),
        )
        for i, reasons in sorted(by_row.items())
    ]
