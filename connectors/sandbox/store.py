"""The sandbox's data: one sorted table per entity set (table.py), patient documents, and a
clock.

The clock only moves when told (`advance`), which inserts, updates and hard-deletes records the
way a day at a clinic would; `drift` is a small change between two page requests. The ground
truth is what a perfect sync would hold.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict, deque
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import EntitySet, Navigation
from connectors.sandbox import columns, generator
from connectors.sandbox.config import PLACES
from connectors.sandbox.document_store import SAMPLE_BYTES, DocumentStore
from connectors.sandbox.table import Table, free_key

DOCUMENTS_PER_PATIENT = 0.05  # seeded documents: about one patient in twenty has one
UPDATABLE_SKIP = frozenset({"id", "created_at", "created_by_id"})
CHANGES_KEPT = 100_000  # drift's log keeps the newest: a sandbox that drifts for days stays small
FEW = 8  # records made from templates (a drift's); more are generated as a batch
TEMPLATES = 64  # templates made per batch


@dataclass(frozen=True)
class Change:
    """One change drift made, for tests that must tell what moved during a run."""

    entity: str
    kind: str  # insert, update or delete
    key: Any
    at: datetime
    # An update that left the change cursor's value as it was: a second write on the same
    # day where the cursor is a date (Claims), which no cursor can show.
    cursor_moved: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "entity": self.entity,
            "kind": self.kind,
            "key": self.key,
            "at": self.at.isoformat(),
            "cursor_moved": self.cursor_moved,
        }


class Store:
    """Every table, the documents and the clock of one sandbox; guard with `lock`."""

    def __init__(
        self,
        seed: int = 7,
        scale: float = 1.0,
        now: datetime | None = None,
        resolved_references: bool = False,
        values: str = "spec",
        dangling: float = 0.0,
    ) -> None:
        self.seed = seed
        self.scale = scale
        self.now = now or columns.EPOCH
        # Every navigation reference set and naming a record that exists, through every
        # insert, update and delete (columns.RESOLVED); off: the spec's dangling and nulls.
        self.resolved_references = resolved_references
        # The values profile (SandboxConfig.values): generated, inserted and updated alike.
        self.profile = generator.profile(values)  # refuses an unknown name before any work
        self.lock = threading.RLock()
        self.tables: dict[str, Table] = {
            name: Table(cat.BY_NAME[name], rows)
            for name, rows in generator.generate(
                seed,
                scale,
                self.now,
                resolved=resolved_references,
                values=values,
                dangling=dangling,
            ).items()
        }
        self.documents = DocumentStore(
            lambda: self.now, make_id=self.profile.document_id, stamp=self.profile.upload_stamp
        )
        self._rng = np.random.default_rng([seed, 99])
        self._next_id = {
            e.name: generator.first_id(e) + generator.size_of(e, scale) for e in cat.ENTITY_SETS
        }
        self._indexes: dict[tuple[str, str], dict[str, list[dict]]] = {}
        self._templates: dict[str, list[dict]] = {}  # per set, records to make new ones of
        self.changes: deque[Change] = deque(maxlen=CHANGES_KEPT)  # drift's, oldest first
        self._seed_documents()

    # -- reading ---------------------------------------------------------------------------

    def table(self, name: str) -> Table:
        return self.tables[name]

    def related(self, entity: EntitySet, nav: Navigation, record: dict) -> list[dict]:
        """Records of `nav.target` whose `remote` equals this record's `local`, comparing
        as text: the same id is a number on one side and a string on the other."""
        value = record.get(nav.local)
        if value is None:
            return []
        if nav.target == cat.DOCUMENTS.name:  # contained: already kept by patient, by id
            return self.documents.list(str(value))
        return self._index(nav.target, nav.remote).get(str(value), [])

    def _index(self, target: str, remote: str) -> dict[str, list[dict]]:
        index = self._indexes.get((target, remote))
        if index is None:
            index = defaultdict(list)
            for row in self.tables[target].rows:
                value = row.get(remote)
                if value is not None:
                    index[str(value)].append(row)
            self._indexes[(target, remote)] = index
        return index

    def counts(self) -> dict[str, int]:
        return {name: len(t) for name, t in self.tables.items()}

    def ground_truth(self) -> dict[str, list[dict]]:
        """Every current record of every set (and the document metadata), as served: the
        documents of a patient deleted (hard, as drift and `advance` do) are not, since the
        API reaches them only through their patient (404 for it)."""
        truth = {name: [dict(r) for r in t.rows] for name, t in self.tables.items()}
        patients = self.tables[cat.PATIENTS.name].by_key
        truth[cat.DOCUMENTS.name] = [d for d in self.documents.all() if d["patient_id"] in patients]
        return truth

    # -- changing ---------------------------------------------------------------------------

    def advance(
        self,
        seconds: float = 86400,
        insert_fraction: float = 0.01,
        update_fraction: float = 0.01,
        delete_fraction: float = 0.002,
        document_fraction: float = 0.0,
        sets: Collection[str] | None = None,
    ) -> dict[str, dict[str, int]]:
        """Move the clock; insert, update and hard-delete records in every set (or in `sets`,
        by name); with `document_fraction`, upload that share of the documents count to random
        patients and delete as large a share (reported as "Documents"; 0 leaves documents as
        they are)."""
        for name, value in (
            ("seconds", seconds),
            ("insert_fraction", insert_fraction),
            ("update_fraction", update_fraction),
            ("delete_fraction", delete_fraction),
            ("document_fraction", document_fraction),
        ):
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        before = self.now
        self.now = before + timedelta(seconds=seconds)
        summary = {}
        for name, table in self.tables.items():
            if sets is not None and name not in sets:
                continue
            n = len(table)
            deleted = len(self._delete(table, self._share(n, delete_fraction)))
            updated = len(self._update(table, self._share(n, update_fraction), before))
            inserted = self._insert(table, self._share(n, insert_fraction), before)
            summary[name] = {"inserted": inserted, "updated": updated, "deleted": deleted}
        self._indexes.clear()
        if document_fraction:
            summary[cat.DOCUMENTS.name] = self._advance_documents(document_fraction)
        return summary

    def _advance_documents(self, fraction: float) -> dict[str, int]:
        """A day of uploads and deletes of patient documents, at `fraction` of their count."""
        held = [(p, m["id"]) for p, docs in self.documents.by_patient.items() for m in docs]
        deletes = self._share(len(held), fraction)
        picks = self._rng.choice(len(held), size=min(deletes, len(held)), replace=False)
        for i in picks.tolist():
            self.documents.delete(*held[i])
        patients = self.tables[cat.PATIENTS.name].keys
        uploads = self._share(len(held), fraction) if patients else 0
        for i in self._rng.integers(0, len(patients), uploads).tolist():
            self._add_sample_document(str(patients[i]), i)
        return {"inserted": uploads, "updated": 0, "deleted": len(picks)}

    def drift(
        self,
        entity: EntitySet,
        *,
        inserts: int = 1,
        updates: int = 1,
        deletes: int = 1,
        rng: random.Random,
        place: str | None = None,
    ) -> None:
        """A change between two page requests of one set, the worst the spec allows: hard
        deletes, inserts whose keys land before, between or after the keys a reader has
        passed (`place`; None: anywhere), and updates that move the set's change cursor.
        Logged in `changes`."""
        table = self.tables[entity.name]
        before = self.now
        self.now = before + timedelta(seconds=1)
        for _ in range(deletes):
            if len(table):
                key = table.keys[rng.randrange(len(table))]
                table.delete(key)
                self.changes.append(Change(entity.name, "delete", key, self.now))
                for name, kind, other in self._keep_references(entity, [key]):
                    self.changes.append(Change(name, kind, other, self.now))
        for _ in range(inserts):
            key = free_key(table, place or rng.choice(PLACES), rng)
            if key is None:
                continue
            self._insert(table, 1, before, key=key)
            self.changes.append(Change(entity.name, "insert", key, self.now))
        for key, moved in self._update(table, updates, before, rng=rng):
            self.changes.append(Change(entity.name, "update", key, self.now, moved))
        self._indexes.clear()

    def drift_documents(self, *, uploads: int = 1, deletes: int = 1, rng: random.Random) -> None:
        """Documents change between two listing requests as a clinic's do: deletes of any
        document, uploads to random patients (patients a reader has listed already too).
        Logged in `changes` as the entity "Documents"."""
        self.now += timedelta(seconds=1)
        name = cat.DOCUMENTS.name
        for _ in range(deletes):
            documents = [
                (p, m["id"]) for p, docs in self.documents.by_patient.items() for m in docs
            ]
            if documents:
                patient_id, doc_id = documents[rng.randrange(len(documents))]
                self.documents.delete(patient_id, doc_id)
                self.changes.append(Change(name, "delete", doc_id, self.now))
        patients = self.tables[cat.PATIENTS.name]
        for _ in range(uploads):
            if len(patients):
                patient_id = str(patients.keys[rng.randrange(len(patients))])
                meta = self._add_sample_document(patient_id, rng.randrange(1_000_000))
                self.changes.append(Change(name, "insert", meta["id"], self.now))

    def plant(self, entity: EntitySet, record: dict) -> None:
        """Put any record, even a malformed one, into a set (hostile-data tests)."""
        self.tables[entity.name].upsert(record)
        self._indexes.clear()

    def _share(self, n: int, fraction: float) -> int:
        return int(self._rng.binomial(n, min(fraction, 1.0))) if n else 0

    def _insert(self, table: Table, n: int, after: datetime, key: Any = None) -> int:
        """`n` new records created in (after, now]; `key` gives the one record its key."""
        if n == 0:
            return 0
        name = table.entity.name
        records = self._fresh(table.entity, n, after, first_id=self._next_id[name])
        self._next_id[name] += n
        if key is not None:
            records[0][table.entity.key] = key
        # A serial that a drift insert already took as its key is no new record.
        fresh = [r for r in records if r[table.entity.key] not in table.by_key]
        for record in fresh:
            table.upsert(record)
        return len(fresh)

    def _fresh(self, entity: EntitySet, n: int, after: datetime, first_id: int = 0) -> list[dict]:
        """`n` records as new ones would be, created in (after, now]. A few (a drift's) come
        from templates made a batch at a time and stamped now: the generator's cost is per
        call, whatever its size (about 15 ms a call), and drift makes one at every request."""
        if n > FEW:
            return self._make(entity, n, after, first_id)
        pool = self._templates.setdefault(entity.name, [])
        if len(pool) < n:
            pool.extend(self._make(entity, TEMPLATES, after, 0))
        records, pool[:n] = pool[:n], []
        ids = self.profile.ids(entity, first_id, n, self._rng)
        moments = self._rng.uniform(after.timestamp(), self.now.timestamp(), n).astype(np.int64) + 1
        for record, key, moment in zip(records, ids, moments.tolist(), strict=True):
            record[entity.key] = key
            for name in ("created_at", "updated_at"):
                if name in entity.by_name:
                    stamp = entity.field(name)
                    record[name] = self.profile.instants(stamp, self._rng, np.array([moment]))[0]
            if self.resolved_references:
                self._resolve(entity, record)
        return records

    def _make(self, entity: EntitySet, n: int, after: datetime, first_id: int) -> list[dict]:
        return generator.make_records(
            entity,
            n,
            rng=self._rng,
            made={k: t.rows for k, t in self.tables.items()},
            made_keys={k: t.keys for k, t in self.tables.items()},
            first_id=first_id,
            now=self.now.timestamp(),
            created_after=after.timestamp(),
            resolved=self.resolved_references,
            rules=self.profile,
        )

    def _resolve(self, entity: EntitySet, record: dict) -> None:
        """A template's references made to name records that exist now (made earlier, it
        may name one deleted since)."""
        for child_name, field_name, parent_name in sorted(columns.RESOLVED):
            if child_name != entity.name:
                continue
            survivors = columns.joinable(self.tables[parent_name].keys, entity.field(field_name))
            if survivors:
                record[field_name] = survivors[int(self._rng.integers(len(survivors)))]

    def _update(
        self, table: Table, n: int, after: datetime, rng: random.Random | None = None
    ) -> list[tuple[Any, bool]]:
        """Change a few fields of `n` records, with values a new record would have, and move
        their `updated_at` past `after` where the set has one; the keys changed, each with
        whether its change cursor's value moved."""
        if n == 0 or not len(table):
            return []
        entity = table.entity
        template = self._fresh(entity, n, after)
        changeable = [f.name for f in entity.fields if f.name not in UPDATABLE_SKIP]
        size = min(n, len(table))
        picks = (
            rng.sample(range(len(table)), size)
            if rng
            else self._rng.choice(len(table), size=size, replace=False).tolist()
        )
        keys = []
        cursor = entity.change_cursor
        for index, fresh in zip(picks, template, strict=False):
            record = dict(table.rows[index])
            was = record.get(cursor) if cursor else None
            for name in self._rng.choice(changeable, size=min(3, len(changeable)), replace=False):
                record[str(name)] = fresh[str(name)]
            if "updated_at" in entity.by_name:
                record["updated_at"] = fresh["updated_at"]
            table.upsert(record)
            keys.append((record.get(entity.key), cursor is None or record.get(cursor) != was))
        return keys

    def _delete(self, table: Table, n: int) -> list[Any]:
        """Hard-delete `n` random records; the keys deleted."""
        if n == 0 or not len(table):
            return []
        picks = self._rng.choice(len(table), size=min(n, len(table)), replace=False)
        keys = [table.rows[i].get(table.entity.key) for i in picks.tolist()]
        gone = [key for key in keys if table.delete(key)]
        self._keep_references(table.entity, gone)
        return gone

    def _keep_references(self, parent: EntitySet, gone: list[Any]) -> list[tuple[str, str, Any]]:
        """With `resolved_references`, nothing may point at the records just deleted: their
        documents go with them (contained), and records whose navigation reference named one
        are updated to name a surviving record instead, as a merge of duplicates does (their
        `updated_at` moves). The changes made: (set, kind, key)."""
        if not self.resolved_references or not gone:
            return []
        changed: list[tuple[str, str, Any]] = []
        if parent is cat.PATIENTS:
            for patient_id in gone:
                for meta in list(self.documents.list(str(patient_id))):
                    self.documents.delete(str(patient_id), meta["id"])
                    changed.append((cat.DOCUMENTS.name, "delete", meta["id"]))
        names = {str(key) for key in gone}
        for child_name, field_name, parent_name in sorted(columns.RESOLVED):
            if parent_name != parent.name:
                continue
            child = self.tables[child_name]
            spec = child.entity.field(field_name)
            survivors = columns.joinable(self.tables[parent.name].keys, spec)
            if not survivors:
                continue
            stamp = child.entity.by_name.get("updated_at")
            orphans = [r for r in child.rows if str(r.get(field_name)) in names]
            for row in orphans:
                record = dict(row)
                record[field_name] = survivors[int(self._rng.integers(len(survivors)))]
                if stamp is not None:
                    moment = np.array([int(self.now.timestamp())])
                    record["updated_at"] = self.profile.instants(stamp, self._rng, moment)[0]
                child.upsert(record)
                changed.append((child_name, "update", record.get(child.entity.key)))
        self._indexes.clear()
        return changed

    def _seed_documents(self) -> None:
        patients = self.tables[cat.PATIENTS.name].rows
        rng = np.random.default_rng([self.seed, 98])
        for i in np.flatnonzero(rng.random(len(patients)) < DOCUMENTS_PER_PATIENT).tolist():
            self._add_sample_document(patients[i]["id"], i)

    def _add_sample_document(self, patient_id: str, i: int) -> dict:
        """A small valid file of one of the accepted types, varied by `i`."""
        kinds = list(SAMPLE_BYTES)
        content_type = kinds[i % len(kinds)]
        return self.documents.add(
            patient_id=patient_id,
            content_type=content_type,
            data=SAMPLE_BYTES[content_type] + f"patient {i}".encode(),
            **self.profile.document_fields(i, content_type),
        )
