"""Case 2: `clinical-sync sync` killed with SIGKILL while it fetches, while it writes Parquet
and inside the DuckDB load, several times in a row; then a run to completion."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from connectors.clinical_records.catalogue import ENTITY_SETS, EntitySet
from connectors.sandbox.server import SandboxServer
from sync.strategy import parse_watermark
from tests.reliability.conftest import (
    SIZE,
    Target,
    assert_lake_sound,
    assert_matches,
    canonical,
    compare,
    sandbox_config,
    truth,
)
from warehouse.publish import working_path

pytestmark = pytest.mark.reliability

POLL = 0.002


def fetching(target: Target) -> bool:
    """The limiter's bucket file exists once the first request is on its way."""
    return (target.root / "ratelimit.sqlite").exists()


def writing_parquet(target: Target) -> bool:
    """A batch is being written under `_tmp/` (or the first one has just landed)."""
    tmp = target.lake / "_tmp"
    return (tmp.exists() and any(tmp.iterdir())) or any(target.lake.glob("entity=*/*/*.parquet"))


def loading(target: Target) -> bool:
    """DuckDB's write-ahead log (of the working copy) exists while a load transaction writes."""
    return Path(f"{working_path(target.warehouse)}.wal").exists()


# Phase -> (what shows it has begun, the longest random delay before the kill, in seconds).
PHASES: dict[str, tuple[Callable[[Target], bool], float]] = {
    "fetch": (fetching, 0.3),
    "parquet": (writing_parquet, 0.02),
    "load": (loading, 1.0),  # somewhere among the eight loads and the models
}


def kill_during(target: Target, phase: str, rng: random.Random, log: Path) -> bool:
    """Start a sync, SIGKILL it when `phase` is seen (plus a little random delay); True if
    the process was still running when killed."""
    proc = target.start("sync", log=log)
    deadline = time.monotonic() + 120
    seen, delay = PHASES[phase]
    while proc.poll() is None and not seen(target) and time.monotonic() < deadline:
        time.sleep(POLL)
    time.sleep(rng.uniform(0, delay))
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return alive


def cursor_text(value: object) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def assert_watermarks_cover_loaded_rows(target: Target, source: dict[str, list[dict]]) -> None:
    """No committed watermark passed a source record that is not in the warehouse."""
    if not target.warehouse.exists():
        return
    try:
        marks = dict(target.query('SELECT "entity", "watermark" FROM "ops"."sync_state"'))
    except duckdb.CatalogException:
        return  # killed before the schema was created
    ent: EntitySet
    for ent in ENTITY_SETS:
        mark = marks.get(ent.name)
        if ent.cursor is None or mark is None:
            continue
        limit = parse_watermark(ent, mark)
        held = set(r[0] for r in target.query(f'SELECT "{ent.key}" FROM "clinical"."{ent.table}"'))
        behind = [
            key
            for key, record in canonical(ent, source[ent.name]).items()
            if record[ent.cursor] is not None
            and parse_watermark(ent, cursor_text(record[ent.cursor])) <= limit
            and key not in held
        ]
        assert not behind, f"{ent.name}: watermark {mark} passed unloaded keys {behind[:3]}"


def test_sync_survives_sigkill_in_every_phase(tmp_path, ledger):
    rng = random.Random(6)
    with SandboxServer(sandbox_config(seed=47, scale=0.1, latency=0.01)) as server:
        target = Target(server, tmp_path / "target")
        target.root.mkdir(parents=True)
        source = truth(server)  # the source stays still: the end state is known
        killed = []
        rounds = SIZE
        for n, phase in enumerate([p for _ in range(rounds) for p in PHASES]):
            if kill_during(target, phase, rng, tmp_path / f"kill-{n}.log"):
                killed.append(phase)
            assert_watermarks_cover_loaded_rows(target, source)
        assert len(killed) >= 2, f"the syncs finished before the kills: {killed}"
        ledger.crashes_survived += len(killed)

        done = target.sync()
        assert "sync failed" not in done.stderr
        assert_matches(compare(target, source), ledger)
        assert_watermarks_cover_loaded_rows(target, source)
        assert_lake_sound(target)
