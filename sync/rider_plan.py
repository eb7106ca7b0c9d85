"""How a child read whole in its parents' pages is completed once they are read, and why:
ride on (the children no parent brought found by filter, by key and by key ranges) or read
the set alone, whichever costs fewer requests (the rules: sync/packed.py). Pure, so that the
cost decision is tested like `budget.allot`, apart from the reads that carry it out
(sync/riders.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from connectors.clinical_records.catalogue import PAGE_SIZE, EntitySet
from connectors.clinical_records.keys import entity_key, key_text


@dataclass(frozen=True)
class HeldChildren:
    """The children the warehouse held last run, by what became of their parent."""

    under_parent_not_read: tuple[Any, ...] = ()  # asked for by key (known orphans)
    under_parent_read: tuple[Any, ...] = ()  # did not come with their parent: gone
    without_parent: tuple[Any, ...] = ()  # a null reference: found by filter
    parents_not_read: tuple[Any, ...] = ()  # theirs: every child asked for by reference


def held_children(
    entity: EntitySet, parents: Mapping[Any, Any], parents_read_whole: Collection[str]
) -> HeldChildren:
    """Split the held children (key -> parent's key, as the warehouse holds them) by their
    parent: read whole this run (as `key_text`), not read, or none. Keys in the API's kind."""
    not_read, read, without = [], [], []
    parents_not_read: dict[str | None, Any] = {}
    for held_key, parent in parents.items():
        key = entity_key(entity, held_key)
        if key is None:
            continue
        if parent is None:
            without.append(key)
        elif key_text(parent) in parents_read_whole:
            read.append(key)
        else:
            not_read.append(key)
            parents_not_read.setdefault(key_text(parent), parent)
    return HeldChildren(
        tuple(not_read), tuple(read), tuple(without), tuple(parents_not_read.values())
    )


def orphan_cost(pages: int, nulls: int, dangling: int) -> int:
    """Requests to find the children no parent reaches: the null ones by a filter, each
    dangling one by halving key ranges (bounded by reading the whole set)."""
    found = math.ceil(nulls / PAGE_SIZE) + (1 if nulls else 0)
    if dangling:
        found += min(pages, math.ceil(dangling * (2 + math.log2(max(2, pages / dangling)))))
    return found


@dataclass(frozen=True)
class Completion:
    """A snapshot rider's choice: its counts when the read began, what the parents' pages
    brought, and what finding the rest would cost."""

    started_total: int  # the set's count when the read began
    reached: int  # the nested counts of the parents read
    nulls: int  # children with a null reference (counted only when some were not reached)
    known: int  # held under a parent not read now: asked for by key and by parent ...
    known_requests: int  # ... in this many requests (`orphans.requests`)
    parents_cut_short: int  # parents whose children did not all come: read one by one

    @property
    def pages(self) -> int:
        """Requests to read the set alone."""
        return max(1, math.ceil(self.started_total / PAGE_SIZE))

    @property
    def new(self) -> int:
        """About how many children there before the read no parent brought, nor a null
        reference, nor a key held: new, with a missing parent, found by key ranges."""
        not_reached = max(0, self.started_total - self.reached)
        return max(0, not_reached - self.nulls - self.known)

    @property
    def find(self) -> int:
        """Requests to find every child the parents' pages did not bring."""
        return (
            orphan_cost(self.pages, self.nulls, self.new)
            + self.known_requests
            + self.parents_cut_short
        )

    @property
    def read_alone(self) -> bool:
        return self.find >= self.pages

    def reason(self) -> str:
        """The choice and its figures, as the log and the result's reason tell it."""
        if self.read_alone:
            return (
                f"read alone: {self.nulls} with no parent, {self.known} under a parent not "
                f"read and about {self.new} new with a missing parent would cost about "
                f"{self.find} requests to find, reading it costs {self.pages}"
            )
        return (
            f"with its parents; {self.nulls} with no parent read by filter, {self.known} held "
            f"under a parent not read asked for by key and by parent in "
            f"{self.known_requests} requests, about {self.new} new with a missing parent "
            f"found by key ranges, "
            f"{self.parents_cut_short} parents read alone (about {self.find} requests against "
            f"{self.pages} to read it alone)"
        )
