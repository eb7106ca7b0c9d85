"""What a family's extraction reads, decided from the sets' plans before any request: which
children ride in the parents' pages, which are read alone, and what the parents' pages
ask for (the rules: sync/packed.py). Pure, so that it is tested like `budget.allot`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from connectors.clinical_records.catalogue import DOCUMENTS, RIDES_WITH, EntitySet
from connectors.clinical_records.query import Expand, Query
from sync.extract import cursor_filter
from sync.strategy import Mode, Plan


@dataclass(frozen=True)
class PackedRead:
    """One read of the parents' pages and the children it carries."""

    root: EntitySet
    root_plan: Plan | None  # the root read as its plan says; None: its keys only, to carry
    carried: tuple[EntitySet, ...]  # the children it carries, in the family's order
    listed: tuple[EntitySet, ...] = ()  # of them, listed per parent: $expand refused

    @property
    def expanded(self) -> tuple[EntitySet, ...]:
        """The children that come nested in the parents' pages."""
        return tuple(c for c in self.carried if c not in self.listed)

    @property
    def payer(self) -> EntitySet:
        """The set whose figures the parents' pages are charged to: the root when it is read
        for itself, else the first child it carries."""
        return self.root if self.root_plan is not None else self.carried[0]

    def query(self) -> Query:
        """The parents' pages: the root's records (or keys), each child nested with its count
        (what proves that every child of a parent came)."""
        root, whole = self.root, self.root_plan is not None
        return Query(
            root,
            filter=cursor_filter(self.root_plan) if self.root_plan is not None else None,
            select=None if whole else [root.key],
            expand=[Expand(RIDES_WITH[c.name][1].name, count=True) for c in self.expanded],
        )

    def listing_documents(self) -> PackedRead:
        """The same read once the service refused to expand the documents: they are listed
        per patient instead."""
        refused = tuple(c for c in self.expanded if c is DOCUMENTS)
        return replace(self, listed=(*self.listed, *refused))


@dataclass(frozen=True)
class FamilyRead:
    """How one family is read this run."""

    packed: PackedRead | None  # None: nothing rides, every set is read alone
    read_separately: tuple[EntitySet, ...]  # each read by itself (`sync.extract.extract`)
    skipped: tuple[EntitySet, ...]  # chosen, with nothing to read this run


def plan_family(
    family: Sequence[EntitySet], plans: Mapping[str, Plan], documents_refused: bool
) -> FamilyRead:
    """A child rides in its parent's pages when it is read whole or past its watermark and
    the parent's pages pass every parent: the root is read whole, or the child has no set of
    its own (documents; their patients' keys are then read to carry them). Every other chosen
    set is read alone; `documents_refused`: the service refused to expand documents lately."""
    root, children = family[0], family[1:]
    root_plan = plans.get(root.name)
    root_whole = root_plan is not None and root_plan.mode is Mode.SNAPSHOT
    carried: list[EntitySet] = []
    separately: list[EntitySet] = []
    skipped: list[EntitySet] = []
    for child in children:
        child_plan = plans.get(child.name)
        if child_plan is None:
            continue
        if child_plan.mode is Mode.SKIP:
            skipped.append(child)
            continue
        rides = child_plan.mode in (Mode.SNAPSHOT, Mode.INCREMENTAL)
        (carried if rides and (root_whole or child.contained_in) else separately).append(child)
    if root_plan is not None and not root_whole:
        separately.insert(0, root)
    packed = None
    if carried or root_whole:
        listed = tuple(c for c in carried if c is DOCUMENTS and documents_refused)
        packed = PackedRead(root, root_plan if root_whole else None, tuple(carried), listed)
    return FamilyRead(packed, tuple(separately), tuple(skipped))
