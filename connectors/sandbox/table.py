"""One entity set's current records in the sandbox, sorted by key: key order and keyset paging
cost a bisection; and where drift can insert a key a reader has passed or not yet reached.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Hashable
from typing import Any

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.catalogue import EntitySet
from connectors.sandbox import columns
from connectors.sandbox.config import PLACES

SCANS_KEPT = 8  # scans a table keeps at once (a read's filter, its count, a probe's order)


def sort_key(value: Any) -> tuple[int, Any]:
    """Orders any key: numbers, then strings, then anything odd a hostile row may carry."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, repr(value))


def free_key(table: Table, place: str, rng: random.Random) -> Any:
    """A key not in `table` that sorts before its first key, between two of its keys or
    after its last, in the set's own kind: numbers (within Int32), digit strings or opaque
    strings (a prefix of the first key sorts before every key)."""
    keys = table.keys
    numeric = table.entity.key_field.type is cat.Edm.INT32
    if not keys:
        return 1 if numeric else "1"
    for _ in range(50):
        if place == "before":
            first = keys[0]
            # Below the smallest number (zero and negatives are Int32 too); for text, a
            # proper prefix of the first key sorts before it.
            candidate = first - 1 if numeric else str(first)[:-1]
        elif place == "between":
            i = rng.randrange(len(keys) - 1) if len(keys) > 1 else 0
            low = keys[i]
            if numeric:
                high = keys[i + 1] if i + 1 < len(keys) else low + 2
                candidate = low + 1 if high - low > 1 else None
            else:
                candidate = f"{low}0"  # sorts right after `low`
        else:
            last = keys[-1]
            candidate = last + 1 if numeric else f"{last}9"
        fits = candidate not in (None, "") and sort_key(candidate)[0] == sort_key(keys[0])[0]
        if numeric and fits:
            fits = columns.INT32_MIN <= candidate <= columns.INT32_MAX
        if fits and candidate not in table.by_key:
            return candidate
        place = rng.choice(PLACES)
    return None


class Table:
    """The current records of one entity set, sorted by key."""

    def __init__(self, entity: EntitySet, rows: list[dict]) -> None:
        self.entity = entity
        self.rows: list[dict] = sorted(rows, key=lambda r: sort_key(r.get(entity.key)))
        self.keys: list = [r.get(entity.key) for r in self.rows]  # parallel to rows, for bisection
        self._order: list[tuple[int, Any]] = [sort_key(k) for k in self.keys]
        self.by_key: dict[Any, dict] = dict(zip(self.keys, self.rows, strict=True))
        self.version = 0  # moved on by every change, after it: what a kept scan was of
        self._scans: dict[Hashable, tuple[int, list[dict]]] = {}

    def scanned(self, what: Hashable, scan: Callable[[], list[dict]]) -> list[dict]:
        """The rows `scan` finds, kept until the table next changes: a read's `$skip`
        windows and its count ask the same filter page after page, and at scale 300 each
        scanned millions of rows (the sandbox, not the client, set the pace)."""
        kept = self._scans.get(what)
        if kept is not None and kept[0] == self.version:
            return kept[1]
        version = self.version
        rows = scan()
        if len(self._scans) >= SCANS_KEPT:
            self._scans.clear()
        self._scans[what] = (version, rows)
        return rows

    def get(self, key: Any) -> dict | None:
        return self.by_key.get(key)

    def upsert(self, record: dict) -> None:
        key = record.get(self.entity.key)
        order = sort_key(key)
        position = bisect_left(self._order, order)
        if key in self.by_key:
            self.rows[position] = record
        else:
            self._order.insert(position, order)
            self.keys.insert(position, key)
            self.rows.insert(position, record)
        self.by_key[key] = record
        self.version += 1

    def delete(self, key: Any) -> bool:
        if key not in self.by_key:
            return False
        position = bisect_left(self._order, sort_key(key))
        del self._order[position], self.keys[position], self.rows[position]
        del self.by_key[key]
        self.version += 1
        return True

    def __len__(self) -> int:
        return len(self.rows)
