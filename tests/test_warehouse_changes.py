"""What changed last night, and any set as of any moment, against the sandbox's own records.

Three syncs (full, then two nightly runs after a day of changes each, documents included): the
latest run's rows of `analytics.changes` are exactly the records the sandbox inserted, updated
and deleted that day, with the columns that moved; `history.<table>_as_of(t)` at the end of
each sync equals the sandbox's state at that sync, for every set. The oracle is the sandbox's
records before and after each day, through the warehouse's own normaliser.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.runner import sync
from tests.truth import canonical
from warehouse.ddl import as_of_macro
from warehouse.ident import column_list, qualified
from warehouse.publish import working_path

pytestmark = pytest.mark.e2e

Truth = dict[str, dict[object, dict]]  # set -> key -> canonical record


@dataclass
class Synced:
    warehouse: Path
    truths: list[Truth]  # the source after each sync
    ends: list[datetime]  # when each sync ended
    run_ids: list[str]


def _truth(server: SandboxServer) -> Truth:
    with server.store.lock:
        records = server.store.ground_truth()
    return {e.name: canonical(e, records[e.name]) for e in ALL_ENTITIES}


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> Iterator[Synced]:
    root = tmp_path_factory.mktemp("changes")
    with SandboxServer(SandboxConfig(seed=31, scale=0.1)) as server:
        env = {
            **server.env(),
            "CLINICAL_RATE_LIMIT": "1000",
            "CLINICAL_BURST": "200",
            "CLINICAL_LIMITER_PATH": str(root / "ratelimit.sqlite"),
        }
        done = Synced(root / "warehouse.duckdb", [], [], [])
        for night in range(3):
            if night:
                with server.store.lock:
                    server.store.advance(
                        seconds=86400,
                        insert_fraction=0.02,
                        update_fraction=0.03,
                        delete_fraction=0.01,
                        document_fraction=0.3,
                    )
            report = sync(
                env,
                lake_root=str(root / "lake"),
                warehouse_path=str(done.warehouse),
                full=not night,
            )
            assert report.success, report.failure
            done.ends.append(datetime.now(UTC))
            done.truths.append(_truth(server))
            done.run_ids.append(report.run_id)
        yield done


def _query(path: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        return con.execute(sql, params or []).fetchall()


def _day(before: Truth, after: Truth) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """What the source did between two syncs: (set, id, change, columns that moved)."""
    out = set()
    for name, now in after.items():
        was = before[name]
        out |= {(name, str(k), "inserted", ()) for k in now.keys() - was.keys()}
        out |= {(name, str(k), "deleted", ()) for k in was.keys() - now.keys()}
        for k in now.keys() & was.keys():
            moved = tuple(sorted(c for c in now[k] if now[k][c] != was[k][c]))
            if moved:
                out.add((name, str(k), "updated", moved))
    return out


def _changes(path: Path, run_id: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    rows = _query(
        path,
        "SELECT entity, id, change, changed_columns FROM analytics.changes WHERE run_id = ?",
        [run_id],
    )
    return {(e, i, c, tuple(sorted(cols or ()))) for e, i, c, cols in rows}


@pytest.mark.parametrize("night", [1, 2])
def test_a_nights_changes_are_exactly_what_the_source_did(synced, night):
    expected = _day(synced.truths[night - 1], synced.truths[night])
    kinds = {(entity, change) for entity, _, change, _ in expected}
    assert {"inserted", "updated", "deleted"} <= {change for _, change in kinds}
    assert ("Documents", "inserted") in kinds and ("Documents", "deleted") in kinds
    published = _changes(synced.warehouse, synced.run_ids[night])
    assert published == expected
    # One row per record a run changed, all carrying the time its load committed.
    (rows, distinct) = _query(
        synced.warehouse,
        "SELECT count(*), count(DISTINCT (entity, id)) FROM analytics.changes WHERE run_id = ?",
        [synced.run_ids[night]],
    )[0]
    assert rows == distinct == len(expected)


def test_the_first_sync_inserted_every_record(synced):
    expected = {
        (name, str(k), "inserted", ()) for name, rows in synced.truths[0].items() for k in rows
    }
    assert _changes(synced.warehouse, synced.run_ids[0]) == expected


def test_last_night_is_the_latest_runs_rows(synced):
    (latest,) = _query(
        synced.warehouse,
        "SELECT run_id FROM analytics.changes ORDER BY synced_at DESC LIMIT 1",
    )[0]
    assert latest == synced.run_ids[-1]


def _as_of(path: Path, entity: EntitySet, at: datetime) -> dict[object, dict]:
    with duckdb.connect(str(path), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        rows = (
            con.sql(
                f"SELECT {column_list(f.name for f in entity.fields)} "
                f"FROM {qualified('history', as_of_macro(entity))}(?)",
                params=[at],
            )
            .to_arrow_table()
            .to_pylist()
        )
    return {r[entity.key]: r for r in rows}


@pytest.mark.parametrize("entity", ALL_ENTITIES, ids=lambda e: e.name)
def test_as_of_the_end_of_each_sync_is_the_source_then(synced, entity):
    for sync_no, (end, truth) in enumerate(zip(synced.ends, synced.truths, strict=True)):
        held = _as_of(synced.warehouse, entity, end)
        assert held.keys() == truth[entity.name].keys(), (entity.name, sync_no)
        differing = [k for k, r in truth[entity.name].items() if held[k] != r]
        assert not differing, (entity.name, sync_no, differing[:3])
    # Before the first sync the warehouse held nothing.
    assert _as_of(synced.warehouse, entity, synced.ends[0].replace(year=2000)) == {}


def test_the_working_copy_and_a_read_only_connection_call_the_macros(synced):
    """The published copy carries the macros; an analyst's read-only connection calls them
    (the working copy, the one the sync writes, has them too)."""
    for path in (synced.warehouse, working_path(synced.warehouse)):
        (count,) = _query(path, "SELECT count(*) FROM history.claims_as_of(now())")[0]
        (live,) = _query(path, "SELECT count(*) FROM clinical.claims WHERE _deleted_at IS NULL")[0]
        assert count == live
