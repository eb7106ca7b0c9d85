"""JSON records -> a canonical Arrow table, column by column with pyarrow compute.

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

from connectors.clinical_records.catalogue import (
    Canonical,
    EntitySet,
    Field,
)
from warehouse.converters import (
    ACCEPTED_KINDS,
    CONVERTERS,
    KIND_BY_TYPE,
    TEXT_BY_KIND,
    bool_mask,
)
from warehouse.schema import EXTRAS, arrow_schema, json_struct_type

log = logging.getLogger(__name__)

REJECT = "reject"
WARNING = "warning"


@dataclass(frozen=True)
class Reject:
    """A row that could not be normalised (kind "reject") or was kept with a note ("warning")."""

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


def _loose_column(
    records: Sequence[dict], fld: Field
) -> tuple[pa.Array, list[tuple[np.ndarray, str]]]:
    """A column whose JSON kinds are mixed: accepted kinds as text, the others rejected."""
    accepted = ACCEPTED_KINDS[fld.canonical]
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
    arrow_type = pa.bool_() if fld.canonical is Canonical.BOOLEAN else pa.string()
    expected = " or ".join(sorted(accepted))
    errors = [(mask, f"got a JSON {kind}, expected {expected}") for kind, mask in wrong.items()]
    return pa.array(out, arrow_type), errors


def _raw_columns(
    entity: EntitySet, records: Sequence[dict]
) -> tuple[dict[str, pa.Array], list[tuple[str, np.ndarray, str]]]:
    """Each known field as an Arrow array of its JSON type, or as text where kinds are mixed."""
    struct_type = json_struct_type(entity)
    errors: list[tuple[str, np.ndarray, str]] = []
    loose = _floats_in_integers(struct_type, records)
    if not loose:
        try:
            struct = pa.array(records, type=struct_type)
            return {f.name: struct.field(f.name) for f in entity.fields}, errors
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
        errors.extend((fld.name, mask, reason) for mask, reason in wrong)
    return columns, errors


def _floats_in_integers(struct_type: pa.StructType, records: Sequence[dict]) -> set[str]:
    """Integer fields holding a JSON number with a fraction or exponent: pyarrow would
    truncate 1.5 to 1 without a word, so these columns take the loose path and reject it."""
    integers = [f.name for f in struct_type if f.type == pa.int64()]
    return {name for name in integers if any(type(r.get(name)) is float for r in records)}


def _extras(records: Sequence[dict], unknown: list[str]) -> pa.Array:
    rows = []
    for record in records:
        extra = {k: record[k] for k in unknown if k in record}
        rows.append(json.dumps(extra, ensure_ascii=False, default=str) if extra else None)
    return pa.array(rows, pa.string())


def _raw_json(record: object) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)


def _key_of(entity: EntitySet, record: object) -> str | None:
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

    raw, problems = _raw_columns(entity, objects)
    errors = [(name, mask, reason) for name, mask, reason in problems]
    warnings: list[tuple[str, np.ndarray, str]] = []
    columns: list[pa.Array] = []
    for fld in entity.fields:
        column = raw[fld.name]
        if fld.required:
            errors.append((fld.name, ~bool_mask(column.is_valid()), "missing (required)"))
        converted = CONVERTERS[fld.canonical](column, fld)
        expected = f"expected {fld.canonical.value}"
        errors.extend((fld.name, m, f"{why}; {expected}") for m, why in converted.errors)
        warnings.extend((fld.name, m, why) for m, why in converted.warnings)
        columns.append(converted.values)
    columns.append(_extras(objects, unknown) if unknown else pa.nulls(len(objects), pa.string()))
    table = pa.Table.from_arrays(columns, schema=schema)

    rejected = np.zeros(len(objects), dtype=bool)
    for _, mask, _ in errors:
        rejected |= mask
    rejects += _notes(entity, objects, errors, REJECT, np.ones(len(objects), dtype=bool))
    rejects += _notes(entity, objects, warnings, WARNING, ~rejected)
    for name in unknown:
        example = next(r for r in objects if name in r)
        reason = f"field unknown to the catalogue in {counts[name]} records; kept in {EXTRAS}"
        rejects.append(
            Reject(entity.name, None, WARNING, (name,), reason, _raw_json(example)),
        )
    if unknown:
        log.warning("%s: %d unknown fields kept in %s", entity.name, len(unknown), EXTRAS)
    if rejected.any():
        log.warning("%s: %d of %d records rejected", entity.name, rejected.sum(), len(objects))
        table = table.filter(pa.array(~rejected))
    return NormalisedBatch(table, rejects, set(unknown))


def _notes(
    entity: EntitySet,
    records: Sequence[dict],
    problems: list[tuple[str, np.ndarray, str]],
    kind: str,
    rows: np.ndarray,
) -> list[Reject]:
    """One Reject per affected row, its reasons joined: `field: why; ...`."""
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
            "; ".join(f"{name}: {why}" for name, why in reasons),
            _raw_json(records[i]),
        )
        for i, reasons in sorted(by_row.items())
    ]
