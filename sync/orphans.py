"""Known orphans read again in batches: the children held last run under a parent that was
not read now (a dangling reference, or a parent deleted since) are asked for by key, and
every child of such a parent that the warehouse held by reference (`prescription_id eq p`),
as many terms per request as `id eq a or prescription_id eq p or ...` fits `QUERY_LIMIT`.
By reference finds what no key names: a child the day inserted under a parent the run then
deleted before its page, which no page brings and only a count could miss (seed 6281: a
count cancelled it against a delete, and the set was called exact).

Spec 4.2 lists `eq, gt, ge, lt, le, and` as the `$filter` operators seen, so `or` may be
refused: the first batch of two terms or more is the probe (it costs nothing where `or` is
accepted). A 400 is remembered in `ServiceMemory`, like a refused Documents expansion, and
the terms are then asked for one request each until `retry_after` has passed. The planner
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


Term = tuple[str, Any]  # `field eq value`: a key, or a reference to a parent


def terms_query(entity: EntitySet, terms: Sequence[Term], *, one_page: bool = False) -> Query:
    """The records any of `terms` matches: one page (`$top`) where all are keys or
    `one_page` says so, else page after page."""
    keys_only = one_page or all(name == entity.key for name, _ in terms)
    condition = any_of(*(F(name) == value for name, value in terms))
    return Query(entity, filter=condition, top=len(terms) if keys_only else None)


def key_query(entity: EntitySet, keys: Sequence[Any]) -> Query:
    """One request for `keys` (in the API's kind): `id eq a or id eq b ...`, one page."""
    return terms_query(entity, [(entity.key, k) for k in keys])


def query_length(entity: EntitySet, keys: Sequence[Any]) -> int:
    """The encoded query string of `key_query` (what `QUERY_LIMIT` bounds)."""
    return _length(key_query(entity, keys))


def _length(query: Query) -> int:
    return len(urlencode(query.params(), quote_via=quote))


def batches(entity: EntitySet, keys: Sequence[Any], limit: int = QUERY_LIMIT) -> list[list[Any]]:
    """`keys` in order, cut into requests that each fit `limit` and one page (at most
    PAGE_SIZE keys, so one request brings every record asked for)."""
    plan = term_batches(entity, [(entity.key, k) for k in keys], limit)
    return [[value for _, value in batch] for batch in plan]


def term_batches(
    entity: EntitySet, terms: Sequence[Term], limit: int = QUERY_LIMIT
) -> list[list[Term]]:
    """`terms` in order, cut into requests that each fit `limit` (at most PAGE_SIZE terms).
    A term too long to share a request still gets one of its own. Linear: a batch's length
    grows by what each term adds, never measured whole again (as a key query: its `$top`
    only lengthens it, so a paged one fits too)."""
    out: list[list[Term]] = []
    length = 0  # of the last batch's query
    for term in terms:
        last = out[-1] if out else None
        if last and len(last) < PAGE_SIZE:
            grown = length + _added(entity, term, len(last))
            if grown <= limit:
                last.append(term)
                length = grown
                continue
        out.append([term])
        length = _length(terms_query(entity, [term], one_page=True))  # `$top`: the longest
    return out


def _added(entity: EntitySet, term: Term, n: int) -> int:
    """How much longer a batch's encoded query grows as `term` joins `n` terms: its ` or`
    term, the parentheses a second term brings (`any_of`), a digit more of `$top` at 10 and
    100."""
    name, value = term
    words = _encoded(f" or {(F(name) == value).render(entity)}")
    return words + (_encoded("()") if n == 1 else 0) + len(str(n + 1)) - len(str(n))


def _encoded(text: str) -> int:
    """Characters of `text` in a query string as `urlencode` writes it (`/` too escaped)."""
    return len(quote(text, safe=""))


def requests(
    entity: EntitySet, keys: Sequence[Any], memory: ServiceMemory, refs: Sequence[Term] = ()
) -> int:
    """What re-reading `keys`, and the children `refs` names, costs: one request per batch,
    or per term where the service refused `or` (a service not yet asked is expected to
    accept: a refusal costs one more); a batch whose children fill more than a page, more."""
    terms = [(entity.key, k) for k in keys] + list(refs)
    if not terms:
        return 0
    if memory.refuses(FILTER_OR_REFUSED):
        return len(terms)
    return len(term_batches(entity, terms))


def read_known(
    client: ClinicalClient,
    entity: EntitySet,
    keys: Sequence[Any],
    memory: ServiceMemory,
    say: Any,
    refs: Sequence[Term] = (),
) -> list[dict]:
    """The records of `keys` that still exist, and every child `refs` names (`(reference,
    parent)`), in batches where `or` is accepted."""
    terms = [(entity.key, k) for k in keys] + list(refs)
    if not terms:
        return []
    if memory.refuses(FILTER_OR_REFUSED):
        return _one_by_one(client, entity, terms)
    plan = term_batches(entity, terms)
    probe = next((i for i, batch in enumerate(plan) if len(batch) > 1), None)
    found = _one_by_one(client, entity, [t for batch in plan[:probe] for t in batch])
    if probe is None:
        return found
    try:
        found += _matching(client, entity, plan[probe])
    except BadRequest as refused:
        memory.refuse(FILTER_OR_REFUSED)
        rest = [t for batch in plan[probe:] for t in batch]
        say.warning(
            f"{entity.name}: the service refused 'or' in $filter ({refused.status}); "
            f"{len(rest)} records or parents not read now are asked for one request each, "
            f"until it is tried again"
        )
        return found + _one_by_one(client, entity, rest)
    memory.accepted(FILTER_OR_REFUSED)
    fetch = lambda batch: _matching(client, entity, batch)  # noqa: E731
    for records in client.each(fetch, plan[probe + 1 :]):
        found += records or []
    return found


def _matching(client: ClinicalClient, entity: EntitySet, terms: Sequence[Term]) -> list[dict]:
    """Every record one batch's terms match (a page of keys; children, page after page)."""
    query = terms_query(entity, terms)
    if query.top is not None:
        return client.page(entity, query)["value"]
    return [r for page in client.iter_pages(entity, query) for r in page.records]


def _one_by_one(client: ClinicalClient, entity: EntitySet, terms: Sequence[Term]) -> list[dict]:
    """Each record by its key (one deleted meanwhile, 404, is not), each parent's children
    by its reference."""
    keys = [value for name, value in terms if name == entity.key]
    refs = [term for term in terms if term[0] != entity.key]
    found = [record for record in client.by_key(entity, keys) if record is not None]
    for records in client.each(lambda term: _matching(client, entity, [term]), refs):
        found += records or []
    return found
