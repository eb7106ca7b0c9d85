"""Exactness, kept in one place: a set is exact when its last look follows every other look.

A run calls a set exact when the set equals the source as it stood at the set's last look,
the request (or the few requests of one round, a probe and the window's count) whose answer
settled it (`Reconciler.last_look`). That claim holds only if the last look was sent after
every other request of the run that touched the set, as the set asked or as one expanded
into another set's page or counted per parent, had been answered: an answer that came later
may show a change the last look did not. Every request of a run is in the one meter's
journal (`Counters.looks`); `unsettled` checks every set against it at the end of the run,
and whatever fails is looked at again (sync/settle.py) or reported, never called exact.

A record that a response carries is itself a look: the reconciliation takes every record of
its own set that a response brings into the batch (`ClientSource`), and a request that shows
another set (a small set asked for counts per parent) is one more look that set's last look
must follow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.clinical_records.meter import Look
from connectors.clinical_records.query import Query
from sync.reconcile_ledger import Ledger
from sync.reconcile_source import Source


@dataclass(frozen=True)
class LastLook:
    """The look that settled a set: when its first request was sent, and the requests that
    make it up (a probe, and the count of the window since the mark)."""

    entity: str
    sent: float
    ids: frozenset[str]

    @classmethod
    def of(cls, entity: str, looks: Sequence[Look]) -> LastLook | None:
        """The round of requests `looks` as one look at `entity` (None: no request)."""
        if not looks:
            return None
        return cls(entity, min(look.sent for look in looks), frozenset(look.id for look in looks))

    def as_dict(self) -> dict[str, object]:
        return {"entity": self.entity, "sent": self.sent, "ids": sorted(self.ids)}

    @classmethod
    def from_dict(cls, value: Mapping[str, object]) -> LastLook:
        return cls(str(value["entity"]), float(value["sent"]), frozenset(value["ids"]))  # type: ignore[arg-type]


def later_looks(last: LastLook, looks: Iterable[Look]) -> list[Look]:
    """The looks at `last.entity`, not part of its last look, answered after it was sent."""
    return [
        look
        for look in looks
        if last.entity in look.shows and look.id not in last.ids and look.answered > last.sent
    ]


def unsettled(last_looks: Mapping[str, LastLook], looks: Iterable[Look]) -> dict[str, int]:
    """Per set whose last look does not follow every other look at it, how many came after
    (the sets absent from `last_looks` make no claim: they are reported as they are)."""
    journal = list(looks)
    found = {name: len(later_looks(last, journal)) for name, last in last_looks.items()}
    return {name: count for name, count in found.items() if count}


class Looking:
    """A `Source` under the rule that a response is a look: every record of the set that an
    answer carries (whole records: no `$select`), whatever the request was for, is handed to
    the ledger (`Ledger.seen`, which keeps each version once), so none is dropped.
    Every job of a reconciliation asks through it."""

    def __init__(self, source: Source, ledger: Ledger) -> None:
        self.source, self.ledger, self.entity = source, ledger, source.entity

    @property
    def requests(self) -> int:
        return self.source.requests

    @property
    def looks(self) -> list[Look]:
        return getattr(self.source, "looks", [])

    def page(self, query: Query) -> dict[str, Any]:
        envelope = self.source.page(query)
        if query.entity is self.entity and query.select is None:
            self.ledger.seen(envelope["value"])
        return envelope

    def by_key(self, keys: Sequence[Any]) -> list[dict | None]:
        found = self.source.by_key(keys)
        self.ledger.seen([record for record in found if record is not None])
        return found
