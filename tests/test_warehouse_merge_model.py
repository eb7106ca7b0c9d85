"""The merge against a model of its rules, on random sequences of loads.

Each load holds a few batches (extracted on a few days, in any order relative to earlier
loads), keys repeat within and across batches, cursors tie, go back or are missing, and a
load may be a snapshot. After every load `clinical`, the superseded history and the load's
counts must be what the rules below say; the example tests show each rule alone.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from connectors.clinical_records.catalogue import CLAIMS
from tests.warehouse_records import Harness, record
from warehouse.lake import Lake
from warehouse.load import LoadResult

Row = tuple[int, date | None, str]  # key, cursor (updated_at), content (total_claim_amount)


@dataclass(frozen=True)
class Version:
    cursor: date | None
    amount: str
    extracted: datetime
    deleted: datetime | None = None  # a superseded version: when it ended


def position(v: Version) -> tuple:
    """A version's place among its key's versions: cursor (a missing one first), then
    extraction time (`merge.NEWER`)."""
    return (v.cursor is not None, v.cursor or date.min, v.extracted)


class Model:
    """The merge's rules in plain Python: every version of a key in the load, oldest first
    (cursor, nulls first, extraction time, batch, row), each compared with the current row:
    a newer one replaces it, an older one is placed among the versions held."""

    def __init__(self) -> None:
        self.current: dict[int, Version] = {}
        self.superseded: list[tuple[int, date | None, str, datetime, datetime]] = []
        self.snapshots: list[datetime] = []  # when each snapshot loaded so far was extracted

    def load(self, batches: list[tuple[datetime, list[Row]]], snapshot: bool) -> LoadResult:
        versions: dict[int, list[tuple[tuple, Version]]] = {}
        ordered = sorted(batches, key=lambda b: b[0])
        for order, (extracted, rows) in enumerate(ordered):
            for row_number, (key, cursor, amount) in enumerate(rows):
                rank = (cursor is not None, cursor or date.min, extracted, order, row_number)
                versions.setdefault(key, []).append((rank, Version(cursor, amount, extracted)))
        counts = dict.fromkeys(("inserted", "updated", "unchanged", "resurrected"), 0)
        for key, seen in versions.items():
            for _, new in sorted(seen, key=lambda pair: pair[0]):
                counts[self._apply(key, new)] += 1
        deleted = 0
        if snapshot:
            at = max(extracted for extracted, _ in batches)
            for key, held in self.current.items():
                later = held.deleted is None or held.deleted > at  # a later snapshot's, first
                if key not in versions and later and held.extracted <= at:
                    self.current[key] = replace(held, deleted=at)
                    deleted += 1
            self.snapshots.append(at)
        fetched = sum(len(rows) for _, rows in batches)
        return LoadResult(fetched=fetched, soft_deleted=deleted, **counts)

    def _apply(self, key: int, new: Version) -> str:
        held = self.current.get(key)
        if held is None:
            # A snapshot loaded before but extracted after the version missed the record.
            self.current[key] = replace(new, deleted=self._missed(new))
            return "inserted"
        if position(new) < position(held):
            self._place(key, new)
            return "unchanged"
        back = held.deleted is not None and new.extracted > held.deleted
        same = (new.cursor, new.amount) == (held.cursor, held.amount)
        if same and not back:
            return "unchanged"
        # A version extracted before the deletion was seen replaces the content of a
        # record that stays deleted; one extracted after it brings the record back.
        closed = min(held.deleted, new.extracted) if held.deleted else new.extracted
        self.superseded.append((key, held.cursor, held.amount, held.extracted, closed))
        self.current[key] = new if back else replace(new, deleted=held.deleted)
        return "resurrected" if back else "updated"

    def _missed(self, new: Version) -> datetime | None:
        return min((at for at in self.snapshots if at >= new.extracted), default=None)

    def _place(self, key: int, new: Version) -> None:
        """An older version among the key's versions held (warehouse/history.py)."""
        mine = [i for i, row in enumerate(self.superseded) if row[0] == key]
        chain = [
            (Version(c, a, since, until), i)
            for i in mine
            for _, c, a, since, until in [self.superseded[i]]
        ]
        chain.append((self.current[key], None))
        chain.sort(key=lambda pair: position(pair[0]))
        before = [pair for pair in chain if position(pair[0]) <= position(new)]
        after = [pair for pair in chain if position(pair[0]) > position(new)]
        p, s = (before[-1] if before else None), after[0]
        p_gone = p[0].deleted if p and p[0].extracted < p[0].deleted < s[0].extracted else None
        missed = None if p else self._missed(new)
        content = (new.cursor, new.amount)
        if p and (p[0].cursor, p[0].amount) == content and not (p_gone and p_gone <= new.extracted):
            return  # P seen again
        between = bool(p_gone and p_gone > new.extracted) or bool(
            missed and missed < s[0].extracted
        )
        if p:
            row = self.superseded[p[1]]
            self.superseded[p[1]] = (*row[:4], min(row[4], new.extracted))
        if (s[0].cursor, s[0].amount) == content and not between:
            if s[1] is None:  # S first seen at this version's extraction
                self.current[key] = replace(self.current[key], extracted=new.extracted)
            else:
                row = self.superseded[s[1]]
                self.superseded[s[1]] = (*row[:3], new.extracted, row[4])
            return
        ends = [
            s[0].extracted,
            *([p_gone] if p_gone and p_gone > new.extracted else []),
            *([missed] if missed else []),
        ]
        self.superseded.append((key, new.cursor, new.amount, new.extracted, min(ends)))


keys = st.integers(min_value=1, max_value=3)
cursors = st.sampled_from([None, date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)])
amounts = st.sampled_from(["1", "2", "3"])
rows = st.lists(st.tuples(keys, cursors, amounts), max_size=4)
batch = st.tuples(st.integers(min_value=0, max_value=2), rows)  # (day extracted, rows)
loads = st.lists(
    st.tuples(st.lists(batch, min_size=1, max_size=3), st.booleans()), min_size=2, max_size=5
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(loads)
@example(  # a snapshot misses a record, then a newer batch brings it back
    [
        ([(0, [(1, date(2026, 1, 1), "1")])], False),
        ([(1, [(2, None, "1")])], True),
        ([(2, [(1, date(2026, 1, 1), "2")])], False),
    ]
)
@example(  # a batch extracted before the snapshot that deleted its record loads after it
    [
        ([(0, [(1, None, "1")])], False),
        ([(1, [(2, None, "1")])], True),
        ([(0, [(1, date(2026, 1, 3), "2")])], False),
    ]
)
@example(  # a new record extracted before a snapshot that missed it loads after it
    [
        ([(1, [(2, None, "1")])], True),
        ([(0, [(1, None, "1"), (2, None, "2")])], False),
    ]
)
def test_every_load_leaves_what_the_rules_say(sequence):
    with tempfile.TemporaryDirectory() as root:
        harness = Harness(Path(root), entities=[CLAIMS])
        model = Model()
        try:
            for batches, snapshot in sequence:
                written: list[tuple[datetime, list[Row]]] = []
                paths = []
                for day, batch_rows in batches:
                    records = [
                        record(
                            CLAIMS,
                            key,
                            updated_at=cursor and cursor.isoformat(),
                            total_claim_amount=amount,
                        )
                        for key, cursor, amount in batch_rows
                    ]
                    path = harness.write(CLAIMS, records, day=day, snapshot=snapshot)
                    paths.append(path)
                    written.append(
                        (datetime.fromisoformat(Lake.info(path).extracted_at), batch_rows)
                    )
                result = harness.wh.load(CLAIMS, paths, run_id="r", snapshot=snapshot)
                expected = model.load(written, snapshot)
                for kind in ("updated", "unchanged", "soft_deleted", "resurrected"):
                    if getattr(expected, kind):
                        event(f"a load with rows {kind}")
                assert result == expected
                assert current(harness) == Counter(
                    (key, v.cursor, Decimal(v.amount), v.extracted, v.deleted)
                    for key, v in model.current.items()
                )
                assert superseded(harness) == Counter(
                    (key, cursor, Decimal(amount), since, until)
                    for key, cursor, amount, since, until in model.superseded
                )
        finally:
            harness.close()


def current(harness: Harness) -> Counter[tuple]:
    return Counter(
        harness.rows(
            'SELECT "id", "updated_at", "total_claim_amount", "_extracted_at", "_deleted_at" '
            'FROM "clinical"."claims"'
        )
    )


def superseded(harness: Harness) -> Counter[tuple]:
    return Counter(
        harness.rows(
            'SELECT "id", "updated_at", "total_claim_amount", "_valid_from", "_valid_to" '
            'FROM "history"."claims_superseded"'
        )
    )
