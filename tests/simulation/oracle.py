"""The judge of a simulated run: every set against the service as it stood at its last look.

A set's last look is the last request of the run whose answer reflected it (asked, or
expanded into another set's page, or counted per parent): if the engine is right, that is
the look it settled the set by, and the set equals the service's data as that request was
answered. A set the run calls exact must equal it; a set it does not must differ by no more
records than it reports. Where a set cannot see an update to a record already read (no
`updated_at`, or only its date: `reconcile_mark.blind_spot`), a record may hold any version
the service had during the run; its keys must still be exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from connectors.clinical_records.catalogue import ENTITY_SETS, Edm, EntitySet
from sync.reconcile_mark import blind_spot
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

    @property
    def differences(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.differ)

    @property
    def silent(self) -> bool:
        """Wrong by more than the run said: the one outcome the product may never have."""
        return self.differences > self.reported

    def __str__(self) -> str:
        called = "exact" if self.reported == 0 else f"not exact by {self.reported}"
        return (
            f"{self.run}: {self.entity} called {called}, differs by {self.differences} "
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
        versions = _run_versions(entity, served[run.first_request :])
        held = backend.held(entity)
        verdicts.append(_compare(run.kind, entity, reported, held, truth, versions, backend))
    return verdicts


def _run_versions(entity: EntitySet, served: list) -> dict[Any, list[dict]] | None:
    """Every version (as sent) of every record the service held while the run read, by
    key, where the set cannot see an update to a record already read; None where it can."""
    if not blind_spot(entity):
        return None
    tables = {id(t): t for t in (one.truth.sets[entity.name] for one in served)}
    versions: dict[Any, list[dict]] = {}
    for table in tables.values():
        for key, record in table.items():
            held = versions.setdefault(key, [])
            if not any(record is other for other in held):
                held.append(record)
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
    versions: dict[Any, list[dict]] | None,
    backend: Backend,
) -> Verdict:
    verdict = Verdict(run, entity.name, reported)
    verdict.missing = sorted((k for k in truth if k not in held), key=str)
    verdict.extra = sorted((k for k in held if k not in truth), key=str)
    for key, row in held.items():
        if key not in truth or row == truth[key]:
            continue
        sent = versions.get(_as_sent(entity, key), []) if versions is not None else []
        if any(row in backend.expected(entity, [version]).values() for version in sent):
            continue
        verdict.differ.append(key)
    verdict.differ.sort(key=str)
    return verdict
