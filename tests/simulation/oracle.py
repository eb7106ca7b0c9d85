"""The judge of a simulated run: every set against the service as it stood at its last look.

A set's last look is the last request of the run whose answer reflected it (asked, or
expanded into another set's page, or counted per parent): if the engine is right, that is
the look it settled the set by, and the set equals the service's data as that request was
answered. A set the run calls exact must equal it: one that does not is silent, the outcome
the product may never have. A set the run calls not exact is told with a floor (a count's
difference: docs/reliability.md says why no figure can bound it from above against a
source that changes between any two requests); one that differs by more than its floor is
counted (`Verdict.beyond_floor`), not failed. What the run declares it could not see in a
set (its reconciliation's `blind_to`: none where the last look brought the whole set) is
excused, and nothing else: where it cannot see an update to a record already read (no
`updated_at`, or only its date), a record may hold any version the service had during the
run; where it has no change cursor, or its date cursor's last day outgrew one answer, a key
inserted during the run may be missing as long as as many held keys are extra that the
service had during the run (the pair cancels in every count); in the second case a key the
service deleted between the run's last two requests that showed the set may be extra alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from connectors.clinical_records.catalogue import DOCUMENTS, ENTITY_SETS, Edm, EntitySet
from sync.reconcile_mark import Blind
from tests.simulation.backends import Backend
from tests.simulation.service import Journal
from tests.simulation.world import RunResult


@dataclass
class Verdict:
    """How one set of one run compares with the truth."""

    run: str
    entity: str
    reported: int  # records by which the run says the set may differ
    missing: list[Any] = field(default_factory=list)  # at the service, not held
    extra: list[Any] = field(default_factory=list)  # held, not at the service
    differ: list[Any] = field(default_factory=list)  # held in another version
    excused: int = 0  # of those, differences within the set's declared blind spot

    @property
    def differences(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.differ) - self.excused

    @property
    def silent(self) -> bool:
        """Called exact while wrong: the one outcome the product may never have."""
        return self.reported == 0 and self.differences > 0

    @property
    def beyond_floor(self) -> bool:
        """Called not exact, and wrong by more than the floor the run told."""
        return 0 < self.reported < self.differences

    def __str__(self) -> str:
        called = "exact" if self.reported == 0 else f"not exact by {self.reported}"
        excused = f", {self.excused} more within its blind spot" if self.excused else ""
        return (
            f"{self.run}: {self.entity} called {called}, differs by {self.differences}{excused} "
            f"(missing {self.missing[:5]}, extra {self.extra[:5]}, other version {self.differ[:5]})"
        )


def judge(run: RunResult, journal: Journal, backend: Backend) -> list[Verdict]:
    """Every set the run read, against the truth at its last look."""
    verdicts = []
    served = journal.served[: run.last_request]
    for entity in ENTITY_SETS:
        reported = run.reported(entity.name)
        if reported is None:
            continue
        last = next((s for s in reversed(served) if entity.name in s.touched), None)
        assert last is not None, f"{entity.name} read without a request"
        truth = backend.expected(entity, list(last.truth.sets[entity.name].values()))
        during = served[run.first_request :]
        looks = [one for one in during if entity.name in one.touched]
        verdict = _compare(run.kind, entity, reported, backend.held(entity), truth)
        _excuse(verdict, entity, run.blind(entity.name), during, backend, looks[-2:])
        verdicts.append(verdict)
    if run.reported(DOCUMENTS.name) is not None:
        verdicts.append(_documents(run, served, backend))
    return verdicts


def _documents(run: RunResult, served: list, backend: Backend) -> Verdict:
    """Each patient's documents against the service's at the last request that showed them
    (the patient's page with its documents expanded, or their listing): documents have no
    set to count, so their claim is per patient."""
    verdict = Verdict(run.kind, DOCUMENTS.name, run.reported(DOCUMENTS.name) or 0)
    last: dict[str, Any] = {}
    for one in served[run.first_request :]:
        for patient in one.patients:
            last[patient] = one
    held: dict[str, set[tuple]] = {}
    for record in backend.held(DOCUMENTS).values():
        held.setdefault(str(record.get("patient_id")), set()).add(_document(record))
    for patient, one in last.items():
        sent = [dict(m) for m in one.truth.documents.get(patient, ())]
        want = {_document(r) for r in backend.as_held(DOCUMENTS, sent)}
        have = held.get(patient, set())
        verdict.missing += sorted(d[0] for d in want - have if d[0] not in {h[0] for h in have})
        verdict.extra += sorted(d[0] for d in have - want if d[0] not in {w[0] for w in want})
        verdict.differ += sorted(d[0] for d in have - want if d[0] in {w[0] for w in want})
    return verdict


def _document(record: dict) -> tuple:
    """A document's metadata as one comparable value, its id first."""
    return (str(record.get("id")), *sorted((k, str(v)) for k, v in record.items() if k != "id"))


def _excuse(
    verdict: Verdict,
    entity: EntitySet,
    blind: frozenset[Blind],
    during: list,
    backend: Backend,
    last_two: list,
) -> None:
    """Count the differences the run declared it could not see in the set (`last_two`: the
    run's last two requests that showed it, between which a delete is `DAY_PAIRS`')."""
    if not blind or not during:
        return
    wanted = {_as_sent(entity, key) for key in (*verdict.differ, *verdict.extra)}
    versions = _run_versions(entity, during, wanted)
    if blind & {Blind.UPDATES, Blind.SAME_DAY}:
        held = backend.held(entity)
        for key in verdict.differ:
            sent = versions.get(_as_sent(entity, key), [])
            if any(held[key] in backend.expected(entity, [v]).values() for v in sent):
                verdict.excused += 1
    if blind & {Blind.PAIRS, Blind.DAY_PAIRS}:
        # inserted during the run: absent at some request (a key deleted and then given to a
        # new record, as an insert between held keys may, is an insert too)
        tables = [one.truth.sets[entity.name] for one in during]
        inserted = [k for k in verdict.missing if any(_as_sent(entity, k) not in t for t in tables)]
        existed = [k for k in verdict.extra if _as_sent(entity, k) in versions]
        gap = _deleted_between(entity, last_two) if Blind.DAY_PAIRS in blind else set()
        existed.sort(key=lambda k: _as_sent(entity, k) in gap)  # pair the others first
        paired = min(len(inserted), len(existed))
        alone = {k for k in existed[paired:] if _as_sent(entity, k) in gap}
        verdict.excused += 2 * paired + len(alone)


def _deleted_between(entity: EntitySet, last_two: list) -> set[Any]:
    """Keys (as sent) the service held at the first of the two requests, gone at the second."""
    if len(last_two) < 2:
        return set()
    before, after = (one.truth.sets[entity.name] for one in last_two)
    return {key for key in before if key not in after}


def _run_versions(entity: EntitySet, served: list, keys: set[Any]) -> dict[Any, list[dict]]:
    """Every version (as sent) of the records `keys` names that the service held while the
    run read, by key (only the keys asked: a run's snapshots are many, their records more)."""
    tables = {id(t): t for t in (one.truth.sets[entity.name] for one in served)}.values()
    versions: dict[Any, list[dict]] = {}
    for key in keys:
        distinct = {id(t[key]): t[key] for t in tables if key in t}
        if distinct:
            versions[key] = list(distinct.values())
    return versions


def _as_sent(entity: EntitySet, key: Any) -> Any:
    """A warehouse key as the service keys its records (a number as a number)."""
    return int(key) if entity.key_field.type is not Edm.STRING else key


def _compare(
    run: str,
    entity: EntitySet,
    reported: int,
    held: dict[Any, dict],
    truth: dict[Any, dict],
) -> Verdict:
    verdict = Verdict(run, entity.name, reported)
    verdict.missing = sorted((k for k in truth if k not in held), key=str)
    verdict.extra = sorted((k for k in held if k not in truth), key=str)
    verdict.differ = sorted(
        (k for k, row in held.items() if k in truth and row != truth[k]), key=str
    )
    return verdict
