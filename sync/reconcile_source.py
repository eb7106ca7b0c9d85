"""What reconciliation asks the service, and the one place that counts what it cost.

Reconciliation's jobs (sync/reconcile_*.py) speak to a `Source`, not to the client: a page
of a query (read on page by page, `reconcile_ranges.read_on`), records by key.
`ClientSource` asks the service over HTTP; tests ask an in-memory list of records that
changes on cue (tests/sync/memory_source.py), so the search logic runs without a server.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from connectors.clinical_records.catalogue import EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.meter import Look
from connectors.clinical_records.query import Query


class Source(Protocol):
    """One set as the service answers it now; `requests`: how many this source has sent."""

    entity: EntitySet
    requests: int

    def page(self, query: Query) -> dict[str, Any]:
        """One collection request as `query` states it (its own `$top`); the envelope.
        `query.entity` may be another set (counts per parent ask the small set)."""
        ...

    def by_key(self, keys: Sequence[Any]) -> list[dict | None]:
        """Each record by its key, in order; None for one the service no longer has."""
        ...


class ClientSource:
    """A `Source` over the HTTP client, which it alone asks on reconciliation's behalf."""

    def __init__(self, client: ClinicalClient, entity: EntitySet) -> None:
        self.client, self.entity = client, entity
        self.requests = 0
        self.looks: list[Look] = []  # this source's answered pages, in order (its thread's)

    def page(self, query: Query) -> dict[str, Any]:
        with self._counted():
            envelope = self.client.page(query.entity, query)
        if (look := self.client.stats.latest_look()) is not None:
            self.looks.append(look)
        return envelope

    def by_key(self, keys: Sequence[Any]) -> list[dict | None]:
        with self._counted():
            return list(self.client.by_key(self.entity, keys))

    @contextmanager
    def _counted(self) -> Iterator[None]:
        """The only spot that counts reconciliation's requests, by the client's one meter:
        what this source sent (the client is shared, so not its total)."""
        spent: dict[str, float] = {}
        try:
            with self.client.stats.measure(into=spent):
                yield
        finally:
            self.requests += int(spent.get("requests", 0))
