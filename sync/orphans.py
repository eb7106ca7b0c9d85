"""Known orphans read again in batches: the children held last run under a parent that was
not read now (a dangling reference, or a parent deleted since) are asked for by key, as many
keys per request as `id eq a or id eq b or ...` fits `QUERY_LIMIT`.

Spec 4.2 lists `eq, gt, ge, lt, le, and` as the `$filter` operators seen, so `or` may be
refused: the first batch of two keys or more is the probe (it costs nothing where `or` is
accepted). A 400 is remembered in `ServiceMemory`, like a refused Documents expansion, and
the keys are then asked for one request each until `retry_after` has passed. The planner
(`sync/riders.py`) prices the re-read with `requests` before choosing to ride or read alone.
Logs carry counts only, never an id (PHI).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from connectors.clinical_records.catalogue import PAGE_SIZE, EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import BadRequest
from connectors.clinical_records.query import F, Query, any_of
from sync.service_memory import FILTER_OR_REFUSED, ServiceMemory

QUERY_LIMIT = 2_000
"""Characters of one request's query string, percent-encoded as strictly as `quote` does
(every `$`, space, quote and parenthesis as `%XX`). The spec states no URL limit. 2,000 is
under the 2,083-character URL of Internet Explorer, the figure HTTP guidance still quotes as
the safe length, and a quarter of the 8 KiB request line Apache (`LimitRequestLine` 8190)
and nginx (`large_client_header_buffers` 8k) accept by default: a batch is not refused (414)
for its length by a service behind ordinary servers, and about 85 numeric keys fit."""


def key_query(entity: EntitySet, keys: Sequence[Any]) -> Query:
    """One request for `keys` (in the API's kind): `id eq a or id eq b ...`, one page."""
    return Query(entity, filter=any_of(*(F(entity.key) == k for k in keys)), top=len(keys))


def query_length(entity: EntitySet, keys: Sequence[Any]) -> int:
    """The encoded query string of `key_query` (what `QUERY_LIMIT` bounds)."""
    return len(urlencode(key_query(entity, keys).params(), quote_via=quote))


def batches(entity: EntitySet, keys: Sequence[Any], limit: int = QUERY_LIMIT) -> list[list[Any]]:
    """`keys` in order, cut into requests that each fit `limit` and one page (at most
    PAGE_SIZE keys, so one request brings every record asked for). A key too long to share a
    request still gets one of its own. Linear: a batch's length grows by what each key adds,
    never measured whole again."""
    out: list[list[Any]] = []
    length = 0  # of the last batch's query
    for key in keys:
        last = out[-1] if out else None
        if last and len(last) < PAGE_SIZE:
            grown = length + _added(entity, key, len(last))
            if grown <= limit:
                last.append(key)
                length = grown
                continue
        out.append([key])
        length = query_length(entity, [key])
    return out


def _added(entity: EntitySet, key: Any, n: int) -> int:
    """How much longer `key_query`'s encoded query grows as `key` joins `n` keys: its ` or`
    term, the parentheses a second key brings (`any_of`), a digit more of `$top` at 10 and 100."""
    term = _encoded(f" or {(F(entity.key) == key).render(entity)}")
    return term + (_encoded("()") if n == 1 else 0) + len(str(n + 1)) - len(str(n))


def _encoded(text: str) -> int:
    """Characters of `text` in a query string as `urlencode` writes it (`/` too escaped)."""
    return len(quote(text, safe=""))


def requests(entity: EntitySet, keys: Sequence[Any], memory: ServiceMemory) -> int:
    """What re-reading `keys` costs: one request per batch, or per key where the service
    refused `or` (a service not yet asked is expected to accept: a refusal costs one more)."""
    if not keys:
        return 0
    if memory.refuses(FILTER_OR_REFUSED):
        return len(keys)
    return len(batches(entity, keys))


def read_known(
    client: ClinicalClient, entity: EntitySet, keys: Sequence[Any], memory: ServiceMemory, say: Any
) -> list[dict]:
    """The records of `keys` that still exist, in batches where `or` is accepted."""
    if not keys:
        return []
    if memory.refuses(FILTER_OR_REFUSED):
        return _one_by_one(client, entity, keys)
    plan = batches(entity, keys)
    probe = next((i for i, batch in enumerate(plan) if len(batch) > 1), None)
    found = _one_by_one(client, entity, [k for batch in plan[:probe] for k in batch])
    if probe is None:
        return found
    try:
        found += client.page(entity, key_query(entity, plan[probe]))["value"]
    except BadRequest as refused:
        memory.refuse(FILTER_OR_REFUSED)
        rest = [k for batch in plan[probe:] for k in batch]
        say.warning(
            f"{entity.name}: the service refused 'or' in $filter ({refused.status}); "
            f"{len(rest)} records held under a parent not read are asked for one request "
            f"each, until it is tried again"
        )
        return found + _one_by_one(client, entity, rest)
    memory.accepted(FILTER_OR_REFUSED)
    fetch = lambda batch: client.page(entity, key_query(entity, batch))["value"]  # noqa: E731
    for records in client.each(fetch, plan[probe + 1 :]):
        found += records or []
    return found


def _one_by_one(client: ClinicalClient, entity: EntitySet, keys: Sequence[Any]) -> list[dict]:
    """Each record by its key; one deleted meanwhile (404) is not."""
    return [record for record in client.by_key(entity, keys) if record is not None]
