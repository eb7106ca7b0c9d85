"""The end of a run: every set whose last look does not follow every other look at it is
looked at again, until each does or the rounds are spent (the rule: sync/exactness.py).

Families are read by separate steps, and a request of one may touch another family's set
after that set was settled: Prescriptions' reconciliation counts its records per branch,
`Branches?$expand=Prescriptions($count=true;$top=0)`, and the answer shows Branches as they
stand then. Such a set gets one more look, from the change mark its reconciliation ended at
and the keys the warehouse now holds: the probe (for a small set, the whole set in one page),
what it shows re-read, counts narrowed where they differ. The sets others' looks may touch
(the small sets counted per parent) are looked at last in each round. A look costs a request
or two where nothing changed; a set still touched after its last look when the rounds are
spent is reported, never called exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors.clinical_records.catalogue import ALL_BY_NAME, ENTITY_SETS, EntitySet, partition_of
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.meter import Look
from sync.exactness import LastLook, unsettled
from sync.extract import Batches, Extraction, record_writer
from sync.reconcile import Reconciler, Reconciliation
from sync.strategy import Mode, Plan, SyncState

ROUNDS = 3

# The sets whose records others count per parent: looked at after the others in a round.
COUNTED_PER_PARENT = frozenset(
    parent[0].name for target in ENTITY_SETS if (parent := partition_of(target))
)


class Committed(Protocol):
    """What the warehouse holds now, the run's loads included (`sync.state.CommittedState`)."""

    def state(self, entity: EntitySet) -> SyncState: ...

    def held_keys(self, entity: EntitySet) -> set[Any]: ...


@dataclass
class Settlement:
    """What the end of a run found and did: per set looked at again, its new batches (to
    load in order) and how many looks at it came after its last one; the sets still
    unsettled when the rounds were spent."""

    again: dict[str, list[Extraction]] = field(default_factory=dict)
    touched_after: dict[str, int] = field(default_factory=dict)
    unsettled: dict[str, int] = field(default_factory=dict)

    def reconciliation(self, name: str, first: Reconciliation) -> Reconciliation:
        """How the set ended: its last look's reconciliation, and a set left unsettled not
        exact by at least one record (what changed after its last look is unknown)."""
        found = self.again[name][-1].reconciliation if name in self.again else first
        if name in self.unsettled:
            found.stale = max(found.stale, 1)
        return found


def settle(
    last_looks: Mapping[str, LastLook],
    marks: Mapping[str, str | None],
    looks: Iterable[Look],
    committed: Committed,
    client: ClinicalClient,
    batches: Batches,
    *,
    run_id: str,
    say: Any,
    rounds: int = ROUNDS,
) -> Settlement:
    """Look again at every set whose last look some other look followed. `last_looks`: the
    sets the run settled, by the look that settled each; `marks`: the change mark each
    ended at; `looks`: every request of the run, the other steps' too. `client` asks, and
    its requests join them."""
    journal = list(looks)
    last, marks = dict(last_looks), dict(marks)
    held: dict[str, set[Any]] = {}
    found = Settlement()
    for _ in range(rounds):
        todo = unsettled(last, journal)
        if not todo:
            break
        for name in sorted(todo, key=lambda n: (n in COUNTED_PER_PARENT, n)):
            found.touched_after[name] = found.touched_after.get(name, 0) + todo[name]
            say.info(f"{name}: {todo[name]} requests touched it after its last look; looking again")
            before = len(client.stats.looks)
            again, reconciler = _look_again(
                ALL_BY_NAME[name],
                marks.get(name),
                held.get(name),
                committed,
                client,
                batches,
                run_id,
            )
            journal += client.stats.looks[before:]
            found.again.setdefault(name, []).append(again)
            held[name], marks[name] = set(reconciler.held), reconciler.saved_mark
            if reconciler.last_look is None:  # the budget ran out: reported as it stands
                del last[name]
                found.unsettled[name] = todo[name]
            else:
                last[name] = reconciler.last_look
    found.unsettled.update(unsettled(last, journal))
    return found


def _look_again(
    entity: EntitySet,
    mark: str | None,
    held: set[Any] | None,
    committed: Committed,
    client: ClinicalClient,
    batches: Batches,
    run_id: str,
) -> tuple[Extraction, Reconciler]:
    """One more reconciliation of `entity`, from `mark` and the keys held (the warehouse's,
    or what an earlier look of this run left); its records to a batch of their own."""
    plan = Plan(entity, Mode.INCREMENTAL, "looked at again: touched after its last look")
    writer = batches.writer(plan, run_id, committed.state(entity).watermark)
    keys = committed.held_keys(entity) if held is None else held
    reconciler = Reconciler(entity, client, to_batch=writer.add, held=keys)
    reconciler.resume(mark)
    result = Extraction(entity.name, plan.mode, plan.reason, run_id)
    with client.stats.measure(result.stats):
        result.reconciled(reconciler, reconciler.finish())
        writer.finish(reconciler.deleted_keys())
    record_writer(result, writer, 0)
    return result, reconciler


def journal(looks: Iterable[Look], extractions: Iterable[Extraction]) -> dict[str, Any]:
    """What one extraction step leaves for the end of the run, as JSON: every request it
    sent, and each set's last look and change mark."""
    return {
        "looks": [[k.id, sorted(k.shows), k.sent, k.answered] for k in looks],
        "sets": {
            e.entity: {
                "last_look": e.last_look.as_dict() if e.last_look is not None else None,
                "mark": e.mark,
            }
            for e in extractions
        },
    }


@dataclass
class RunJournal:
    """Every step's journal of one run, together."""

    looks: list[Look] = field(default_factory=list)
    last_looks: dict[str, LastLook] = field(default_factory=dict)
    marks: dict[str, str | None] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)  # the sets the run's extractions read

    @classmethod
    def of(cls, journals: Iterable[Mapping[str, Any]]) -> RunJournal:
        run = cls()
        for one in journals:
            run.looks += [
                Look(i, frozenset(shows), sent, got) for i, shows, sent, got in one["looks"]
            ]
            for name, ended in one["sets"].items():
                run.read.add(name)
                run.marks[name] = ended["mark"]
                if ended["last_look"] is not None:
                    run.last_looks[name] = LastLook.from_dict(ended["last_look"])
        return run
