"""The public face of the connector: what the Dagster assets call.

`ClinicalClient(settings)` owns one HTTP connection pool, one token provider, the machine-wide
rate limiter and a pool of worker threads that keeps several requests in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl

from connectors.clinical_records.catalogue import EntitySet
from connectors.clinical_records.errors import MalformedResponse, NotFound
from connectors.clinical_records.meter import Counters
from connectors.clinical_records.paging import COUNT, Answer, Page, Pager, Progress
from connectors.clinical_records.query import Expand, Expr, Query
from connectors.clinical_records.ratelimit import RequestLimiter, shared_limiter
from connectors.clinical_records.settings import Settings
from connectors.clinical_records.transport import Call, Transport, Wire, path_key

__all__ = ["ClinicalClient", "Page"]

T = TypeVar("T")
R = TypeVar("R")


def collection_validator(wants_count: bool):
    """Checks the collection envelope of spec 4.2 (a `value` list of objects, a count)."""

    def validate(body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("value"), list):
            raise MalformedResponse("collection envelope without a value list")
        if not all(isinstance(item, dict) for item in body["value"]):
            raise MalformedResponse("value holds something other than objects")
        count = body.get(COUNT)
        if wants_count and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise MalformedResponse("@odata.count missing or not a count")

    return validate


def entity_validator(body: Any) -> None:
    if not isinstance(body, dict):
        raise MalformedResponse("entity body is not an object")


class ClinicalClient:
    """Rate-limited, self-healing client of the Clinical Records API; use as a context manager."""

    def __init__(
        self,
        settings: Settings,
        *,
        logger: logging.Logger | None = None,
        limiter: RequestLimiter | None = None,
        progress: Progress | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.settings = settings
        self.stats = Counters()
        self.progress = progress
        self.limiter = limiter or shared_limiter(settings)
        self.wire = wire or Wire()
        self.transport = Transport(settings, self.limiter, self.stats, logger, self.wire)
        self.executor = self.wire.pool(settings.max_in_flight)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.transport.close()
        self.limiter.close()

    # -- collections --------------------------------------------------------------------------

    def iter_pages(
        self,
        entity: EntitySet,
        query: Query | None = None,
        *,
        progress: Progress | None = None,
    ) -> Iterator[Page]:
        """Every record matching `query`, page by page in key order, none lost or repeated."""
        shows = (query or Query(entity)).shows()
        pager = Pager(
            entity,
            query,
            fetch=lambda q, n: self._answer(self._fetch_page(entity, q, n)),
            fetch_link=lambda link, n: self._answer(self._fetch_link(entity, link, n, shows)),
            executor=self.executor,
            in_flight=self.settings.max_in_flight,
            progress=progress or self.progress,
        )
        try:
            for page in pager:
                self.stats.add(pages=1, records=len(page.records))
                yield page
        finally:
            self.stats.add(gap_repairs=pager.repairs)

    def page(self, entity: EntitySet, query: Query) -> dict[str, Any]:
        """One collection request as the query states it (its own $top/$skip); the envelope."""
        return self._fetch_page(entity, query, None)

    def count(self, entity: EntitySet, filter: Expr | None = None) -> int:
        """How many records match `filter` (one request, no records transferred)."""
        envelope = self._fetch_page(entity, Query(entity, filter=filter, top=0, count=True), None)
        return envelope[COUNT]

    def get(
        self,
        entity: EntitySet,
        key: str | int,
        *,
        select: list[str] | None = None,
        expand: list[Expand | str] | None = None,
    ) -> dict[str, Any]:
        """One entity by key, `@odata.context` removed."""
        query = Query(entity, select=select, expand=expand or ())
        path = f"{entity.name}({path_key(key)})"
        call = Call("GET", path, entity.name, query.params(), shows=query.shows())
        body = self.transport.json(call, validate=entity_validator)
        return {k: v for k, v in body.items() if not k.startswith("@odata.")}

    def by_key(self, entity: EntitySet, keys: Sequence[Any]) -> Iterator[dict[str, Any] | None]:
        """Each record by its key, several in flight, in order; None for one gone (404)."""
        return self.each(lambda key: self.get(entity, key), keys)

    def each(self, fetch: Callable[[T], R], items: Sequence[T]) -> Iterator[R | None]:
        """`fetch` of each item, several requests in flight (the limiter paces them), in
        order; None for an item the service no longer knows (404). A pool of its own: a
        `fetch` that pages waits on the client's pool."""

        def one(item: T) -> R | None:
            try:
                return fetch(item)
            except NotFound:
                return None

        with self.wire.pool(self.settings.max_in_flight) as pool:
            yield from pool.map(one, items)

    # -- plumbing -----------------------------------------------------------------------------

    def _fetch_page(self, entity: EntitySet, query: Query, number: int | None) -> dict[str, Any]:
        if query.entity is not entity:
            raise ValueError(f"the query is for {query.entity.name}, not {entity.name}")
        call = Call("GET", entity.name, entity.name, query.params(), number, shows=query.shows())
        return self.transport.json(call, validate=collection_validator(query.count))

    def _answer(self, envelope: dict[str, Any]) -> Answer:
        """The envelope with when it was answered: the look this thread's request just left
        (pages in flight are answered in any order; the pager keeps the newer version)."""
        look = self.stats.latest_look()
        return Answer(envelope, look.answered if look else self.wire.clock.time())

    def _fetch_link(
        self, entity: EntitySet, link: str, number: int, shows: frozenset[str]
    ) -> dict[str, Any]:
        """Follow a nextLink, but only below our own base URL (the token must not leave it)."""
        base = self.settings.base_url + "/"
        if not link.startswith(base):
            raise MalformedResponse("@odata.nextLink points outside the service", entity.name)
        path, _, query_text = link[len(base) :].partition("?")
        params = dict(parse_qsl(query_text, keep_blank_values=True))
        call = Call("GET", path, entity.name, params, number, shows=shows)
        return self.transport.json(call, validate=collection_validator(False))
