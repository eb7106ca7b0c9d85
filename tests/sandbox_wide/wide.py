"""The sandbox's wide values profile (issue 29), read whole over real HTTP: the spec's forms,
written here from the spec (section 2 type notes) and OData's JSON format independently of
the generator, and the helpers that read a wide sandbox as a client pages it. The checks
(test_values.py, test_queries.py) are written from the spec, not from
connectors/sandbox/wide.py, so a profile that narrows fails them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import Edm
from connectors.clinical_records.query import quote

SCALE = 0.2
STRING_KEYED = [e for e in cat.ENTITY_SETS if e.key_field.type is Edm.STRING]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# The spec's forms, written here from the spec (section 2 type notes) and OData's JSON format,
# independently of the generator.
DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")
INSTANT = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?P<hm>[0-9]{2}:[0-9]{2})"
    r"(?P<seconds>:[0-9]{2}(?:\.(?P<fraction>[0-9]{1,12}))?)?"
    r"(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})"
)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LEADING_ZEROS = re.compile(r"0+[1-9][0-9]*")
CANONICAL = re.compile(r"0|-?[1-9][0-9]*")


def instant(text: str) -> tuple[datetime, str]:
    """An Edm.DateTimeOffset as (UTC second, fraction digits): exact, comparable."""
    match = INSTANT.fullmatch(text)
    assert match, text
    local = datetime.fromisoformat(f"{match['date']}T{match['hm']}{(match['seconds'] or '')[:3]}")
    offset = match["offset"].upper()
    shift = timedelta(0)
    if offset != "Z":
        sign = 1 if offset[0] == "+" else -1
        shift = sign * timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6]))
    return (local - shift).replace(tzinfo=UTC), (match["fraction"] or "").rstrip("0")


# -- a wide sandbox, read whole over HTTP ----------------------------------------------------


def keyset(client: httpx.Client, entity: cat.EntitySet) -> list[dict]:
    """Every record of a set by `$orderby=id` and `id gt <last>`, as a client pages it."""
    rows: list[dict] = []
    while True:
        params = {"$orderby": "id", "$top": "100"}
        if rows:
            params["$filter"] = f"id gt {literal(entity, rows[-1]['id'])}"
        page = client.get(entity.name, params=params)
        assert page.status_code == 200, page.text
        rows += page.json()["value"]
        if len(page.json()["value"]) < 100:
            return rows


def literal(entity: cat.EntitySet, key: object) -> str:
    return quote(key) if entity.key_field.type is Edm.STRING else str(key)


def values(data: dict[str, list[dict]], kind: Edm | None = None, keys: bool = True) -> list:
    """Every non-null value of every field (of one Edm type) across all sets."""
    return [
        row[f.name]
        for e in cat.ALL_ENTITIES
        for row in data[e.name]
        for f in e.fields
        if (kind is None or f.type is kind)
        and (keys or f.name != e.key)
        and row.get(f.name) is not None
    ]
