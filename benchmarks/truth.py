"""Does a DuckDB file hold what the sandbox serves? Both sides are brought to the catalogue's
canonical types (exact decimals, UTC instants to the microsecond, dates, times, integer or
text keys), then compared set by set: keys missing, keys still present that the source no
longer has, and rows whose values differ, by field.

Works for our warehouse (`clinical.<table>`, live rows where `_deleted_at` is null) and for
dlt's (`<dataset>.<table>`, every row: dlt's merge has no deletes). A column a tool never
created (dlt leaves out columns that were null in every record) reads as null.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    ENTITY_SETS,
    Canonical,
    EntitySet,
    Field,
)


def _instant(value: Any) -> datetime:
    # ISO 8601 allows a lower-case t and z (RFC 3339, 5.6), which fromisoformat refuses.
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).upper())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _date(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    return value if isinstance(value, date) else date.fromisoformat(str(value))


def _time(value: Any) -> time:
    return value if isinstance(value, time) else time.fromisoformat(str(value))


def _decimal(value: Any) -> Decimal:
    return Decimal(str(value)).normalize()  # str() of a float is its shortest repr


def _integer(value: Any) -> int:
    return int(value)


def _boolean(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() == "true"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


CANONICAL: dict[Canonical, Callable[[Any], Any]] = {
    Canonical.VARCHAR: _text,
    Canonical.BIGINT: _integer,
    Canonical.DECIMAL: _decimal,
    Canonical.BOOLEAN: _boolean,
    Canonical.DATE: _date,
    Canonical.TIMESTAMPTZ: _instant,
    Canonical.TIME: _time,
}

# A tool may type a plain-text field itself (dlt detects ISO timestamps): compare the source
# text read the same way, so a faithful value is not counted as a difference.
BY_LOADED_TYPE: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (bool, _boolean),
    (datetime, _instant),
    (date, _date),
    (time, _time),
    (Decimal, _decimal),
    (float, _decimal),
    (int, _integer),
)


def canonical(value: Any, spec: Field, like: Any = None) -> Any:
    """`value` in the field's canonical type (or in the type of `like` for a text field)."""
    if value is None:
        return None
    convert = CANONICAL[spec.canonical]
    if spec.canonical is Canonical.VARCHAR and like is not None and not isinstance(like, str):
        convert = next((c for t, c in BY_LOADED_TYPE if isinstance(like, t)), _text)
    try:
        return convert(value)
    except (ValueError, TypeError, InvalidOperation):
        return ("unparsable", str(value))


@dataclass
class SetDiff:
    """How one table differs from the source's records of one entity set."""

    entity: str
    source_rows: int
    loaded_rows: int
    missing: int = 0  # at the source, not in the table
    extra: int = 0  # in the table, gone from the source (a hard delete not applied)
    changed: int = 0  # same key, some value differs
    fields: Counter[str] = field(default_factory=Counter)  # differing values per field
    absent_columns: tuple[str, ...] = ()

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.changed)

    def describe(self) -> str:
        if self.equal:
            return "equal"
        parts = [f"{n} {what}" for n, what in self._counts() if n]
        if self.fields:
            top = ", ".join(f"{name} {n}" for name, n in self.fields.most_common(4))
            parts.append(f"fields: {top}")
        return "; ".join(parts)

    def _counts(self) -> Sequence[tuple[int, str]]:
        return (
            (self.missing, "missing"),
            (self.extra, "deleted at source but kept"),
            (self.changed, "stale or different"),
        )


def compare_set(
    entity: EntitySet, source: Iterable[Mapping[str, Any]], loaded: Iterable[Mapping[str, Any]]
) -> SetDiff:
    """Compare one entity set: keys first, then every catalogue field of the shared keys."""
    key = entity.key_field
    truth = {canonical(r.get(entity.key), key): r for r in source}
    table = {canonical(r.get(entity.key), key): r for r in loaded}
    diff = SetDiff(entity.name, len(truth), len(table))
    diff.missing = len(truth.keys() - table.keys())
    diff.extra = len(table.keys() - truth.keys())
    for k in truth.keys() & table.keys():
        want, got = truth[k], table[k]
        differing = [
            f.name
            for f in entity.fields
            if canonical(want.get(f.name), f, got.get(f.name))
            != canonical(got.get(f.name), f, got.get(f.name))
        ]
        if differing:
            diff.changed += 1
            diff.fields.update(differing)
    return diff


def read_table(
    path: Path, schema: str, entity: EntitySet, live_only: bool
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """Rows of `schema.<table>` as dicts of the catalogue's fields; the fields it lacks."""
    if not path.exists():  # the tool failed before it wrote anything
        return [], tuple(f.name for f in entity.fields)
    with duckdb.connect(str(path), read_only=True) as con:
        present = {
            name
            for (name,) in con.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = ? AND table_name = ?",
                [schema, entity.table],
            ).fetchall()
        }
        if not present:
            return [], tuple(f.name for f in entity.fields)
        columns = [f.name for f in entity.fields if f.name in present]
        where = ' WHERE "_deleted_at" IS NULL' if live_only and "_deleted_at" in present else ""
        select = ", ".join(f'"{c}"' for c in columns)
        rows = con.execute(f'SELECT {select} FROM "{schema}"."{entity.table}"{where}').fetchall()
    absent = tuple(f.name for f in entity.fields if f.name not in present)
    return [dict(zip(columns, row, strict=True)) for row in rows], absent


def compare_warehouse(
    path: Path,
    truth: Mapping[str, Sequence[Mapping[str, Any]]],
    schema: str = "clinical",
    live_only: bool = True,
    documents: bool = False,
) -> dict[str, SetDiff]:
    """Every entity set of the DuckDB file at `path` against the sandbox's ground truth;
    with `documents`, the patient documents' metadata (`patient_documents`) too."""
    result = {}
    for entity in (*ENTITY_SETS, *([DOCUMENTS] if documents else [])):
        rows, absent = read_table(path, schema, entity, live_only)
        diff = compare_set(entity, truth.get(entity.name, ()), rows)
        diff.absent_columns = absent
        result[entity.name] = diff
    return result


def summary(diffs: Mapping[str, SetDiff]) -> str:
    """'yes', or 'no: <set>: <what>; ...' naming every set that differs."""
    wrong = [f"{name}: {d.describe()}" for name, d in diffs.items() if not d.equal]
    return "yes" if not wrong else "no: " + " | ".join(wrong)


def column_types(path: Path, schema: str = "clinical") -> dict[tuple[str, str], str]:
    """DuckDB's type of every catalogue column present, by (table, column)."""
    tables = {e.table for e in ENTITY_SETS}
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = ?",
            [schema],
        ).fetchall()
    return {(t, c): kind for t, c, kind in rows if t in tables}


def type_drift(path: Path, schema: str = "clinical") -> Counter[str]:
    """Columns whose warehouse type is not the catalogue's canonical one, counted by
    'canonical as actual' (e.g. 'DECIMAL(18,4) as VARCHAR')."""
    types = column_types(path, schema)
    drift: Counter[str] = Counter()
    for entity in ENTITY_SETS:
        for f in entity.fields:
            actual = types.get((entity.table, f.name))
            if actual is not None and actual != CANONICAL_TYPE_NAMES.get(f.canonical, f.canonical):
                drift[f"{f.canonical.value} as {actual}"] += 1
    return drift


# information_schema spells two canonical types differently from their DDL names.
CANONICAL_TYPE_NAMES: dict[Canonical, str] = {
    Canonical.TIMESTAMPTZ: "TIMESTAMP WITH TIME ZONE",
}


def key_types(path: Path, schema: str = "clinical") -> dict[str, set[str]]:
    """For each logical key family, the DuckDB types its columns have across the sets:
    more than one type means joins across sets need casts."""
    types = column_types(path, schema)
    families: dict[str, set[str]] = {}
    for entity in ENTITY_SETS:
        for f in entity.fields:
            kind = types.get((entity.table, f.name))
            if f.key is not None and kind is not None:
                families.setdefault(f.key, set()).add(kind)
    return families
