"""Synthetic records for the sandbox: deterministic, realistic, and awkward within the spec.

Values are made column by column with numpy (scale 100 is about two million records), from
rules keyed by each field's type, key family and name, so a new catalogue field gets sensible
data without a line here (the rules: connectors/sandbox/columns.py, where a few `OVERRIDES`
give the fields whose meaning matters: statuses, times, money that adds up, the shared
`updated_at` of a bulk edit, dangling claims).

Awkward on purpose, as the real service is: nulls, unicode and quotes in names, strings at
exactly their max length, decimals of varied scale, date-times with offsets and fractions,
ids that are strings in one set and numbers in another.

Two values profiles (`SandboxConfig.values`): "spec", the default above, and "wide", every
field drawn from its spec type alone (connectors/sandbox/wide.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Edm, EntitySet, Field
from connectors.sandbox import columns, wide, wide_moments
from connectors.sandbox.columns import (
    ALWAYS_SET,
    EPOCH,
    HISTORY_SECONDS,
    HOME,
    NULL_SHARE,
    OVERRIDES,
    Context,
    Rule,
    fill,
)
from connectors.sandbox.config import VALUE_PROFILES, checked_values
from connectors.sandbox.document_store import hashed_id, utc_stamp

BASE_SIZE: dict[str, int] = {
    "Patients": 2000,
    "Appointments": 8000,
    "AppointmentTypes": 24,
    "Branches": 12,
    "Physicians": 150,
    "Prescriptions": 2500,
    "Claims": 3000,
    "InsuranceVerifications": 2500,
}
SMALL_SETS = frozenset({"AppointmentTypes", "Branches", "Physicians"})


# Records per set at scale 1 (issue 2); small reference sets grow with the square root.
def size_of(entity: EntitySet, scale: float) -> int:
    base = BASE_SIZE[entity.name]
    factor = scale**0.5 if entity.name in SMALL_SETS else scale
    return max(3, round(base * factor))


def generation_order() -> list[EntitySet]:
    """Referenced sets before the sets that point at them (self references aside)."""
    done: list[EntitySet] = []
    pending = list(cat.ENTITY_SETS)
    while pending:
        for entity in pending:
            needs = {HOME[f.key].name for f in entity.fields if f.key in HOME} - {entity.name}
            if needs <= {e.name for e in done}:
                done.append(entity)
                pending.remove(entity)
                break
    return done


# -- records ---------------------------------------------------------------------------------


def make_ids(entity: EntitySet, start: int, n: int, rng: np.random.Generator) -> list:
    """Keys as the set's own type: numbers, numeric strings, or opaque strings (Appointments)."""
    numbers = range(start, start + n)
    if entity.key_field.type is Edm.INT32:
        return list(numbers)
    if entity.key_field.key in cat.NUMERIC_KEYS:
        return [str(i) for i in numbers]
    prefix = "".join(c for c in entity.type_name if c.isupper())
    # Opaque ids that do not sort in creation order: new records land mid-table, as with UUIDs.
    return [f"{prefix}{(i * 2654435761) % 4294967296:08x}{i:x}" for i in numbers]


@dataclass(frozen=True)
class Profile:
    """How one values profile makes keys (from serials), fields, the text of a cursor a change
    moves, and documents: everything that differs between profiles, so nothing else asks
    which profile it is."""

    ids: Callable[[EntitySet, int, int, np.random.Generator], list]
    fill: Rule
    overrides: Mapping[tuple[str, str], Rule]
    instants: Callable[[Field, np.random.Generator, np.ndarray], list[str]]
    document_id: Callable[[str, int], str]
    upload_stamp: Callable[[datetime, int], str]
    document_fields: Callable[[int, str], dict[str, str | None]]

    def rule(self, entity: EntitySet, fld: Field) -> Rule:
        return self.overrides.get((entity.name, fld.name), self.fill)


PROFILES: dict[str, Profile] = {
    "spec": Profile(
        make_ids,
        fill,
        OVERRIDES,
        columns.instants_as,
        hashed_id,
        utc_stamp,
        columns.document_fields,
    ),
    "wide": Profile(
        wide.make_ids,
        wide.fill,
        wide.OVERRIDES,
        wide_moments.instants_as,
        wide.document_id,
        wide.upload_stamp,
        wide.document_fields,
    ),
}
assert tuple(PROFILES) == VALUE_PROFILES


def profile(values: str) -> Profile:
    return PROFILES[checked_values(values)]


def make_records(
    entity: EntitySet,
    n: int,
    *,
    rng: np.random.Generator,
    made: dict[str, list[dict]],
    first_id: int,
    now: float,
    created_after: float | None = None,
    resolved: bool = False,
    rules: Profile = PROFILES["spec"],
    made_keys: Mapping[str, list] | None = None,
) -> list[dict]:
    """`n` new records of one set; `created_after` places them in (created_after, now];
    `resolved`: every navigation reference set and naming a record of `made`; `rules`: the
    values profile that draws them; `made_keys`: each set's keys in its records' order, where
    the caller keeps them (the store does)."""
    ids = rules.ids(entity, first_id, n, rng)
    start = now - HISTORY_SECONDS if created_after is None else created_after
    created = np.sort(rng.uniform(start, now, n)).astype(np.int64) + 1
    ctx = Context(rng, n, entity, made, ids, now, {}, created, resolved, made_keys or {})
    columns = ctx.columns
    for fld in entity.fields:
        if fld.name == entity.key:
            columns[fld.name] = ids
            continue
        column = rules.rule(entity, fld)(ctx, fld)
        columns[fld.name] = _awkward(column, fld, rng, keep=ctx.resolves(fld))
    names = [f.name for f in entity.fields]
    return [
        dict(zip(names, row, strict=True)) for row in zip(*(columns[k] for k in names), strict=True)
    ]


def _awkward(values: list, fld: Field, rng: np.random.Generator, keep: bool = False) -> list:
    """Nulls where the spec allows them (none when `keep`, though drawn alike so the other
    columns do not change); never longer than the max length."""
    if fld.max_length:
        values = [v[: fld.max_length] if isinstance(v, str) else v for v in values]
    n = len(values)
    if not fld.required and fld.name not in ALWAYS_SET:
        for i in np.flatnonzero(rng.random(n) < NULL_SHARE).tolist():
            if not keep:
                values[i] = None
    return values


def first_id(entity: EntitySet) -> int:
    """Serial of the first generated key: string ids start at 1000, numbers at 1."""
    return 1000 if entity.key_field.type is Edm.STRING else 1


def generate(
    seed: int,
    scale: float,
    now: datetime = EPOCH,
    resolved: bool = False,
    values: str = "spec",
    dangling: float = 0.0,
) -> dict[str, list[dict]]:
    """Every entity set, sorted by key, reproducible from (seed, scale, resolved, values,
    dangling)."""
    rules = profile(values)
    made: dict[str, list[dict]] = {}
    for entity in generation_order():
        rng = np.random.default_rng([seed, cat.ENTITY_SETS.index(entity)])
        rows = make_records(
            entity,
            size_of(entity, scale),
            rng=rng,
            made=made,
            first_id=first_id(entity),
            now=now.timestamp(),
            resolved=resolved,
            rules=rules,
        )
        rows.sort(key=lambda r, k=entity.key: r[k])
        made[entity.name] = rows
    if dangling:
        dangle(made, seed, dangling)
    return {e.name: made[e.name] for e in cat.ENTITY_SETS}


def dangle(made: dict[str, list[dict]], seed: int, share: float) -> None:
    """`share` of every riding child set's parent reference (`RIDES_WITH`) made to name a
    parent that does not exist, on rows drawn uniformly, so they spread through the child's
    keys as real data's do (a profile of `benchmarks/expansion_cost.py`). A stream of its
    own: every other value stays what the seed made."""
    for name, (parent, nav) in sorted(cat.RIDES_WITH.items()):
        if name not in made:  # contained (Documents): kept by patient, not generated
            continue
        rows = made[name]
        rng = np.random.default_rng([seed, 77, cat.ENTITY_SETS.index(cat.BY_NAME[name])])
        picks = rng.choice(len(rows), round(len(rows) * share), replace=False).tolist()
        kind = cat.BY_NAME[name].field(nav.remote).type
        missing = _missing_keys({r[parent.key] for r in made[parent.name]}, kind, len(picks))
        for i, key in zip(sorted(picks), missing, strict=True):
            rows[i][nav.remote] = key


def _missing_keys(existing: set, kind: Edm, n: int) -> list:
    """`n` references of `kind` (a number, or its text) that name no key of `existing`."""
    texts = {str(k) for k in existing}
    out: list = []
    candidate = 2_000_000_000  # within Int32, far above every generated key
    while len(out) < n:
        if str(candidate) not in texts:
            out.append(str(candidate) if kind is Edm.STRING else candidate)
        candidate -= 1
    return out
