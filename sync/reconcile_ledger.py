"""The keys held and the keys gone: the one place reconciliation's jobs change them.

Every job (the change mark, key ranges, counts per parent, children by reference) reports
what it saw here, and every figure of what changed (`caught_up`, `inserted`, `deleted`) is
counted here, as it happens, so no job keeps a copy to keep in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from connectors.clinical_records.catalogue import EntitySet
from connectors.clinical_records.keys import entity_key
from sync.reconcile_source import Source

Records = list[dict]


# Sorted keys: the same fields in another order are the same version. msgspec writes the
# bytes in a third of json.dumps's time, and a record re-read is fingerprinted up to three
# times (the change window's comparison, its note of the version, the ledger's hand-over).
_ENCODER = msgspec.json.Encoder(order="sorted", enc_hook=str)


def fingerprint(record: dict) -> int:
    """One version of a record, to tell it from another (annotations aside). Most records
    carry none: one join of the keys tells, where a copy without them cost more than the
    encoding."""
    if "\0@" in "\0" + "\0".join(record):
        record = {k: v for k, v in record.items() if not k.startswith("@")}
    return hash(_ENCODER.encode(record))


class Ledger:
    """Keys the warehouse will hold for one set after the run. `to_batch` receives each
    version of a record re-read once, to be written with the batch; `watchers` are told of
    every record seen (read or re-read), to note what they need of it (a version, a parent)."""

    def __init__(
        self, entity: EntitySet, to_batch: Callable[[Records], None], held: Iterable[Any] = ()
    ) -> None:
        self.entity, self.to_batch = entity, to_batch
        self.held: set[Any] = set(held)
        self.gone: set[Any] = set()
        self.unkeyed = 0  # records without a usable key: counted by the source, not rangeable
        self.suspects: list[Any] = []  # keys missing from their parent's cell: gone, or moved
        self.caught_up = 0  # records written during the run, re-read by cursor
        self.inserted = 0  # keys found that no read brought
        self.handed: dict[Any, int] = {}  # key -> the version last handed to the batch
        self.shown: set[Any] = set()  # keys `seen` handed to the batch, not yet counted held
        self.watchers: list[Callable[[Records], None]] = []
        # Tell whether a record shown is a version the batch has already (the change mark
        # knows those at or after the mark, and that an older cursor is the version read).
        self.knowers: list[Callable[[dict], bool]] = []

    @property
    def deleted(self) -> int:
        """Keys read, then found gone: soft-deleted by the load."""
        return len(self.gone)

    @property
    def counted(self) -> int:
        """What the source's count should be if the keys held are the source's."""
        return len(self.held) + self.unkeyed

    def progress(self) -> tuple[int, int, int]:
        """What the ledger shows now, to tell whether a search found anything."""
        return len(self.held), len(self.gone), self.caught_up

    def key(self, record: dict) -> Any:
        return entity_key(self.entity, record.get(self.entity.key))

    def read(self, records: Records) -> None:
        """A page of the extraction's own read."""
        for record in records:
            key = self.key(record)
            if key is None:
                self.unkeyed += 1
            else:
                self.held.add(key)
        self._tell(records)

    def settle_range(self, held_here: list[Any], records: Records, *, cell: bool = False) -> None:
        """`records` are a key range as it stands: held keys missing from it are gone, or,
        in a `cell`, suspects: they may have moved to another parent unseen (`confirm`)."""
        there = {k for k in map(self.key, records) if k is not None}
        gone = [k for k in held_here if k not in there]
        if cell:
            self.suspects.extend(gone)
            gone = []
        new = there - self.held
        self.held.difference_update(gone)
        self.gone.update(gone)
        self.gone.difference_update(there)
        self.held.update(there)
        self.inserted += len(new)
        self.add_to_batch(records)

    def rewritten(self, changed: Records) -> None:
        """Records written since the change mark, whose version differs from the one held."""
        for record in changed:
            key = self.key(record)
            self.held.add(key)
            self.gone.discard(key)
        self.caught_up += len(changed)
        self.add_to_batch(changed)

    def count_inserted(self, count: int) -> None:
        """Records a search found that no read brought (the caller takes them)."""
        self.inserted += count

    def forget(self, keys: Iterable[Any]) -> None:
        """Keys known gone without a probe (children missing from a parent read whole)."""
        gone = set(keys)
        self.held.difference_update(gone)
        self.gone.update(gone)

    def suspect(self, keys: Iterable[Any]) -> None:
        """Held keys a read should have brought and did not: asked for by key (`confirm`)."""
        self.suspects.extend(keys)

    def confirm(self, source: Source) -> None:
        """The suspects, each asked for by key: gone (404), or moved to another parent
        unseen, then taken as they are now."""
        keys, self.suspects = self.suspects, []
        if not keys:
            return
        found = source.by_key(keys)
        moved = [record for record in found if record is not None]
        self.gone.update(key for key, record in zip(keys, found, strict=True) if record is None)
        self.held.difference_update(self.gone)
        self.gone.difference_update(self.key(record) for record in moved)
        self.add_to_batch(moved)

    def seen(self, records: Records) -> None:
        """Records an answer carried, whatever it was asked for (sync/exactness.py,
        `Looking`): a version the batch may not have goes to it now. The job that asked
        reads the answer next and counts, settles and notes what it shows as before."""
        new = [r for r in records if not any(knows(r) for knows in self.knowers)]
        if fresh := [record for record in new if self._unhanded(record)]:
            self.to_batch(fresh)
            self.shown.update(key for key in map(self.key, fresh) if key is not None)

    def count_shown(self) -> None:
        """The keys answers carried into the batch, held from now on: the warehouse will hold
        them, so the keys compared with the source's count must include them (seed 1914: four
        such keys cancelled as many unseen deletes in the count, and a set was called exact
        four records over). A key found gone stays gone: the range that showed it gone
        answered later. Called before each comparison with a count (`Reconciler`), not in
        `seen`: the job that asked reads the answer next, and takes the records not held."""
        new = self.shown - self.held - self.gone
        self.held |= new
        self.inserted += len(new)
        self.shown.clear()

    def add_to_batch(self, records: Records) -> None:
        """Records re-read, to be written with the batch; a version already handed is not
        handed again (a record asked for by key after it moved parent comes back with its
        new parent's records: a second copy to write, the same)."""
        self._tell(records)
        if fresh := [record for record in records if self._unhanded(record)]:
            self.to_batch(fresh)

    def _unhanded(self, record: dict) -> bool:
        """Whether this version of the record is yet to be handed (noted as handed now)."""
        key = self.key(record)
        if key is None:  # nothing to tell it by: normalise rejects it, as the read did
            return True
        version = fingerprint(record)
        if self.handed.get(key) == version:
            return False
        self.handed[key] = version
        return True

    def deleted_keys(self) -> list[str]:
        """Keys read, then found gone at the source, as text (the lake's form)."""
        return sorted(str(k) for k in self.gone)

    def _tell(self, records: Records) -> None:
        for watch in self.watchers:
            watch(records)
